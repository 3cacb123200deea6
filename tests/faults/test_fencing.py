"""Fencing, leases and the reconciler, against the real Postgres, Redis and S3 (no engine).

These are the rules that make a duplicate attempt harmless: a stale attempt can
never overwrite a newer record, an expired lease is taken over, a lost message is
republished, and a batch that keeps failing dies instead of looping.
"""

from __future__ import annotations

import time

import redis as redis_lib
from sqlalchemy import text

from ledger.dispatch import make_celery
from ledger.handbacks import expire_leases
from ledger.objects import ObjectStore
from ledger.reconcile import reconcile_once, requeue
from ledger.shards import encode_shard, output_shard_url
from tests.faults.ledger_setup import submit
from tests.support.helpers import wait_for
from worker.batches.ledger_calls import (
    ClaimOutcome,
    claim_batch,
    commit_batch,
    fail_batch,
    heartbeat,
    release_batch,
)
from worker.process.options import WorkerOptions
from worker.process.runtime import WorkerRuntime


def _postmaster_up_s(sessions) -> float:
    with sessions() as s:
        return s.execute(text("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")).scalar_one()


def _first_batch(sessions):
    with sessions() as s:
        return s.execute(text("SELECT id, seq FROM batches ORDER BY seq LIMIT 1")).one()


def _row(sessions, batch_id):
    with sessions() as s:
        return s.execute(text("SELECT status, attempts, failures FROM batches WHERE id = :b"), {"b": batch_id}).one()


def _rows_for(sessions, batch_id):
    with sessions() as s:
        ids = [r[0] for r in s.execute(text("SELECT sample_id FROM samples WHERE batch_id = :b"), {"b": batch_id})]
    return [{"sample_id": i, "status": "done", "usage": {"prompt_tokens": 3, "completion_tokens": 5,
             "reasoning_tokens": 0, "answer_tokens": 5}, "finish_reason": "stop", "turns": 1, "tool_calls": 0}
            for i in ids]


def test_a_stale_attempt_cannot_commit_over_a_newer_one(settings, sessions, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket)
    batch = _first_batch(sessions)
    first = claim_batch(sessions, batch.id, worker="a", lease_s=0.0)
    assert first.outcome is ClaimOutcome.CLAIMED and first.attempt == 1
    time.sleep(0.05)
    # Lease 0: the first attempt counts as lost at once; b takes over with attempt 2.
    second = claim_batch(sessions, batch.id, worker="b", lease_s=0.0)
    assert second.outcome is ClaimOutcome.CLAIMED and second.attempt == 2
    rows = _rows_for(sessions, batch.id)
    assert not commit_batch(sessions, run_id=1, batch_id=batch.id, attempt=1, output_key="s3://x/1",
                            output_sha256="0" * 64, rows=rows)
    assert heartbeat(sessions, {batch.id: 1}) == {batch.id}      # a's heartbeat learns it lost the batch
    assert heartbeat(sessions, {batch.id: 2}) == set()
    assert commit_batch(sessions, run_id=1, batch_id=batch.id, attempt=2, output_key="s3://x/1",
                        output_sha256="0" * 64, rows=rows)
    with sessions() as s:
        b = s.execute(text("SELECT status, attempts, worker FROM batches WHERE id = :b"), {"b": batch.id}).one()
        done = s.execute(text("SELECT count(*) FROM samples WHERE batch_id = :b AND status = 'done'"),
                         {"b": batch.id}).scalar()
    assert (b.status, b.attempts, b.worker) == ("done", 2, "b")
    assert done == len(rows)
    # A late delivery of a done batch is acknowledged without generating.
    assert claim_batch(sessions, batch.id, worker="c", lease_s=0.0).outcome is ClaimOutcome.ALREADY_DONE


def test_a_fenced_attempt_does_not_stop_the_heartbeat_of_a_newer_attempt_of_its_batch_in_the_same_process(
        settings, sessions, tmp_path, s3_bucket):
    """Issue 58, item 5: attempt 1's lease expired (a partition), the republished message came back to
    the same process, which claimed attempt 2. Attempt 1's fenced finish must leave attempt 2's lease kept."""
    lease_s = 2.0
    submit(settings, sessions, tmp_path, s3_bucket)
    batch = _first_batch(sessions)
    rt = WorkerRuntime(settings, WorkerOptions(name="w@twice", lease_s=lease_s, heartbeat_s=0.25, reconcile_s=0))
    try:
        first = claim_batch(rt.sessions, batch.id, worker=rt.options.name, lease_s=0.0)
        assert rt.held.hold(batch.id, first.attempt)
        time.sleep(0.05)
        second = claim_batch(rt.sessions, batch.id, worker=rt.options.name, lease_s=0.0)  # the lease taken over
        assert (first.attempt, second.attempt) == (1, 2)
        assert rt.held.hold(batch.id, second.attempt)
        rt.start_heartbeats()
        wait_for(lambda: rt.held.is_lost(batch.id, 1), timeout_s=10, interval_s=0.1,
                 what="the heartbeat telling attempt 1's thread that attempt 2 owns the batch")
        assert not rt.held.is_lost(batch.id, 2)
        rt.held.drop(batch.id, 1)  # attempt 1's fenced finish: run_batch's finally
        time.sleep(2 * lease_s)
        with sessions.begin() as s:
            expired = expire_leases(s, redis_lib.Redis.from_url(settings.redis_url), lease_s=lease_s, max_attempts=3)
        row = _row(sessions, batch.id)
    finally:
        rt.begin_shutdown()
        rt.close()
    assert expired == [], "attempt 2's lease expired under the live process that holds it"
    assert (row.status, row.attempts, row.failures) == ("running", 2, 0)


def test_a_live_attempt_makes_a_duplicate_delivery_a_no_op(settings, sessions, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket)
    batch = _first_batch(sessions)
    assert claim_batch(sessions, batch.id, worker="a", lease_s=60).outcome is ClaimOutcome.CLAIMED
    dup = claim_batch(sessions, batch.id, worker="b", lease_s=60)
    assert dup.outcome is ClaimOutcome.HELD_ELSEWHERE


def test_a_released_batch_is_claimed_again_without_counting_a_failure(settings, sessions, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket)
    batch = _first_batch(sessions)
    claim = claim_batch(sessions, batch.id, worker="a", lease_s=60)
    release_batch(sessions, batch.id, claim.attempt, reason="handed back at worker shutdown")
    again = claim_batch(sessions, batch.id, worker="b", lease_s=60)
    assert again.outcome is ClaimOutcome.CLAIMED and again.attempt == 2
    with sessions() as s:
        assert s.execute(text("SELECT failures FROM batches WHERE id = :b"), {"b": batch.id}).scalar() == 0


def test_a_batch_that_keeps_failing_becomes_dead_and_stays_dead(settings, sessions, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket)
    batch = _first_batch(sessions)
    statuses = []
    for _ in range(3):
        claim = claim_batch(sessions, batch.id, worker="a", lease_s=60)
        assert claim.outcome is ClaimOutcome.CLAIMED
        statuses.append(fail_batch(sessions, batch.id, claim.attempt, error="boom", max_attempts=3).value)
    assert statuses == ["queued", "queued", "dead"]
    assert claim_batch(sessions, batch.id, worker="a", lease_s=60).outcome is ClaimOutcome.ALREADY_DONE
    with sessions() as s:
        row = s.execute(text("SELECT status, failures, error FROM batches WHERE id = :b"), {"b": batch.id}).one()
    assert (row.status, row.failures, row.error) == ("dead", 3, "boom")


def test_the_reconciler_expires_lost_leases_and_republishes_them(settings, sessions, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket)
    app = make_celery(settings)
    r = redis_lib.Redis.from_url(settings.redis_url)
    r.delete("regen")                                    # the broker lost every message
    batch = _first_batch(sessions)
    claim_batch(sessions, batch.id, worker="crashed", lease_s=60)
    with sessions.begin() as s:                          # its worker stopped heartbeating long ago
        s.execute(text("UPDATE batches SET heartbeat_at = now() - interval '1 hour' WHERE id = :b"), {"b": batch.id})
    # A lease expires only once the ledger has been up for a whole lease (ledger/transitions.py); the
    # session's own Postgres may have started seconds ago, so the lease is short and the wait shorter.
    lease_s = 5
    wait_for(lambda: _postmaster_up_s(sessions) > lease_s, timeout_s=lease_s + 5, what="Postgres up for a lease",
             interval_s=0.2)
    report = reconcile_once(sessions, app, lease_s=lease_s, max_attempts=3, grace_s=0)
    assert report is not None and report.expired == 1
    # The broker was empty, so every queued batch got a message again (4 batches of 5).
    assert report.republished == 4 and r.llen("regen") == 4
    with sessions() as s:
        row = s.execute(text("SELECT status, failures, error FROM batches WHERE id = :b"), {"b": batch.id}).one()
    assert row.status == "queued" and row.failures == 1 and "crashed" in row.error
    # A second pass finds nothing to do: the broker holds the messages now.
    again = reconcile_once(sessions, app, lease_s=lease_s, max_attempts=3, grace_s=0)
    assert again is not None and again.expired == 0 and again.republished == 0 and r.llen("regen") == 4


def test_requeue_rebuilds_the_queue_after_redis_is_flushed(settings, sessions, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket, n=12, batch_size=4)
    r = redis_lib.Redis.from_url(settings.redis_url)
    assert r.llen("regen") == 3
    r.flushdb()
    report = requeue(sessions, make_celery(settings), run="r", lease_s=90)
    assert report.republished == 3 and r.llen("regen") == 3


def test_a_twin_upload_keeps_the_first_shard_and_the_ledger_describes_it(settings, sessions, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket)
    store = ObjectStore()
    url = output_shard_url(f"{s3_bucket}/r", 1)
    first = store.put_if_absent(url, encode_shard([{"sample_id": "s0000", "twin": 1}]))
    second = store.put_if_absent(url, encode_shard([{"sample_id": "s0000", "twin": 2}]))
    assert first.created and not second.created and second.sha256 == first.sha256
    from ledger.shards import decode_shard

    assert [row["twin"] for row in decode_shard(store.get(url))] == [1]


def test_hostile_sample_ids_are_stored_as_data(settings, sessions, tmp_path, s3_bucket):
    """SQL is parameterised and object keys never come from dataset ids."""
    import json

    from ledger.dispatch import make_celery as mk
    from producer.run_config import build_run_config
    from producer.submit import submit_run

    evil = ["'; DROP TABLE samples; --", "../../etc/passwd", "a\\b/../c", "x" * 200]
    data = tmp_path / "evil.jsonl"
    data.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": "hi"}]}) + "\n"
                            for i in evil))
    submit_run(sessions, mk(settings), ObjectStore(), [str(data)], run_name="evil",
               config=build_run_config("tiny", max_tokens=8), output_url=f"{s3_bucket}/evil", batch_size=10,
               queue="regen")
    with sessions() as s:
        ids = {r[0] for r in s.execute(text("SELECT sample_id FROM samples"))}
        keys = [r[0] for r in s.execute(text("SELECT input_key FROM batches"))]
    assert ids == set(evil)
    assert keys == [f"{s3_bucket}/evil/inputs/group-000001.jsonl.zst"]
