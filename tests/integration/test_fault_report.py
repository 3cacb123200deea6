"""The fault table's accounting can fail (issue 58, item 9): a sample doubled across shards is seen.

tests/fixtures/fault_report.py's ``account`` is what every fault test's "0 doubled" rests on. It
counted a sample's rows only in the shard its ledger row names, so a sample committed in a second
shard was never seen. Here duplicates are planted in shards of a real run (Postgres, moto S3).
"""

from __future__ import annotations

from sqlalchemy import text

from ledger.objects import ObjectStore
from ledger.shards import encode_shard, output_shard_url
from tests.faults.ledger_setup import submit
from tests.fixtures.fault_report import account


def _done(sessions, run: str, shards: dict[int, list[tuple[str, str]]]) -> set[str]:
    """Write each batch's shard (``seq: [(sample id, status)]``) and mark it and its own samples as committed."""
    store = ObjectStore()
    with sessions.begin() as s:
        batches = s.execute(text("SELECT b.id, b.seq, r.output_url FROM batches b JOIN runs r ON r.id = b.run_id "
                                 "WHERE r.name = :n"), {"n": run}).all()
        for b in batches:
            key = output_shard_url(b.output_url, b.seq)
            store.put(key, encode_shard([{"sample_id": sid, "status": status} for sid, status in shards[b.seq]]))
            s.execute(text("UPDATE batches SET status = 'done', output_key = :k WHERE id = :b"), {"k": key, "b": b.id})
            s.execute(text("UPDATE samples SET status = 'done', output_key = :k WHERE batch_id = :b"),
                      {"k": key, "b": b.id})
        return set(s.scalars(text("SELECT sample_id FROM samples")))


def _ids(sessions, seq: int) -> list[str]:
    with sessions() as s:
        return list(s.scalars(text("SELECT s.sample_id FROM samples s JOIN batches b ON b.id = s.batch_id "
                                   "WHERE b.seq = :q ORDER BY s.sample_id"), {"q": seq}))


def test_a_sample_doubled_in_another_shard_is_counted_and_a_retried_failure_is_not(settings, sessions, s3_bucket,
                                                                                   tmp_path):
    submit(settings, sessions, tmp_path, s3_bucket, run="dup", n=12, batch_size=4)
    one, two, three = _ids(sessions, 1), _ids(sessions, 2), _ids(sessions, 3)
    ids = _done(sessions, "dup", {
        1: [(sid, "done") for sid in one],
        # Batch 1's first sample committed again in batch 2's shard: the ledger names batch 1's shard only.
        2: [(sid, "done") for sid in two] + [(one[0], "done")],
        # A failed row of batch 1's second sample, as `retry --failed` leaves one behind when it moves a
        # sample to a new batch: history, not a duplicate.
        3: [(sid, "done") for sid in three] + [(one[1], "failed")],
    })
    row = account(sessions, "dup", expected_ids=ids)
    assert (row.done, row.lost, row.dup_ledger, row.dup_outputs) == (12, 0, 0, 1)
