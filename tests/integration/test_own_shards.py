"""A batch commits only its own rows (issue 58, item 1), against the real Postgres, Redis and moto S3 (no engine).

A worker that finds an object at its batch's output key commits it without generating. The object
may be another run's: one on the same prefix, or the old run's after ``regen clean --force`` and a
new submit, uploaded by a worker still running it. Such rows are refused by run, config hash and
sample ids before the commit, and the commit itself records the batch's samples, all of them, or
nothing. A NUL in a stop reason or an error string, which Postgres refuses in text, is no longer a
commit that fails for ever (item 6).
"""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import text

from ledger.dispatch import BatchMessage, make_celery
from ledger.objects import ObjectStore
from ledger.shards import decode_shard, encode_shard, input_shard_url, output_shard_url
from producer.clean import clean_run
from producer.retry import retry_dead, retry_failed
from producer.run_config import build_run_config
from producer.submit import SubmitInProgress, submit_run
from tests.faults.ledger_setup import submit, write_dataset
from worker.batches.delivery import Outcome, Requeue, run_batch
from worker.batches.ledger_calls import IncompleteCommit, claim_batch, commit_batch, fail_batch
from worker.process.options import WorkerOptions
from worker.process.runtime import WorkerRuntime

LEASE_S = 60.0


def _batches(sessions, run: str) -> list:
    with sessions() as s:
        return s.execute(text(
            "SELECT b.id, b.seq, b.run_id, b.input_key, b.status, b.failures, b.error, r.name, r.config_hash, "
            "r.output_url, array(SELECT sample_id FROM samples WHERE batch_id = b.id ORDER BY sample_id) AS ids "
            "FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = :n ORDER BY b.seq"), {"n": run}).all()


def _rows(ids, *, run: str | None, config_hash: str, detail: str = "no template") -> list[dict]:
    """Rows as a worker writes them, failed (no generation needed to classify them)."""
    return [{"run": run, "sample_id": sid, "provenance": {"config_hash": config_hash}, "status": "failed",
             "error": {"reason": "template_error", "detail": detail}, "messages": None, "events": [],
             "finish_reason": None, "stop_reason": None, "turns": 0, "tool_calls": 0,
             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "answer_tokens": 0}}
            for sid in ids]


def _submit(settings, sessions, tmp_path, output_url: str, *, run: str, n: int, prefix: str) -> None:
    data = write_dataset(tmp_path / f"{prefix}.jsonl", n, prefix=prefix)
    submit_run(sessions, make_celery(settings), ObjectStore(), [str(data)], run_name=run,
               config=build_run_config("tiny", max_tokens=16, seed=1), output_url=output_url, batch_size=4,
               queue="regen")


def _deliver(rt: WorkerRuntime, b) -> Outcome | str:
    msg = BatchMessage(run=b.name, run_id=b.run_id, batch_id=b.id, seq=b.seq, input_key=b.input_key)
    try:
        return run_batch(rt, msg)
    except Requeue as e:
        return f"requeued: {e}"


@pytest.fixture
def runtime(settings):
    rt = WorkerRuntime(dataclasses.replace(settings), WorkerOptions(name="w@own", lease_s=LEASE_S, heartbeat_s=5.0,
                                                                    reconcile_s=0))
    yield rt
    rt.begin_shutdown()
    rt.close()


def test_a_shard_at_the_batchs_key_is_committed_only_if_its_rows_are_the_batchs(settings, sessions, s3_bucket,
                                                                               tmp_path, runtime):
    store = ObjectStore()
    # An old run on the prefix; cleaned with --force while its worker still runs, then submitted anew with
    # other rows under the same name and config: the old worker's late upload lands at the new batch 1's key.
    _submit(settings, sessions, tmp_path, f"{s3_bucket}/r", run="r", n=16, prefix="old")
    old = _batches(sessions, "r")
    clean_run(sessions, store, "r", delete_ledger=True, force=True)
    _submit(settings, sessions, tmp_path, f"{s3_bucket}/r", run="r", n=20, prefix="new")
    new = _batches(sessions, "r")
    out = new[0].output_url
    assert set(new[0].ids) != set(old[0].ids)  # the premise: another dataset, so other sample ids
    planted = {
        1: _rows(old[0].ids, run="r", config_hash=new[0].config_hash),          # the old run's late upload
        2: _rows(new[1].ids, run="other", config_hash=new[0].config_hash),      # another run's, same samples
        3: _rows(new[2].ids, run="r", config_hash="0" * 64),                     # another config
        4: _rows(new[3].ids[:3], run="r", config_hash=new[0].config_hash),       # one sample short
        5: _rows(new[4].ids, run="r", config_hash=new[0].config_hash),           # its own (an earlier attempt's)
    }
    for seq, rows in planted.items():
        store.put(output_shard_url(out, seq), encode_shard(rows))
    outcomes = {b.seq: _deliver(runtime, b) for b in new}
    after = {b.seq: b for b in _batches(sessions, "r")}
    for seq, why in ((1, "sample ids are not the batch's: 4 not in it"), (2, "rows of run 'other', not 'r'"),
                     (3, "rows of config hash 000000000000"), (4, "1 of its 4 missing")):
        assert isinstance(outcomes[seq], str) and outcomes[seq].startswith("requeued"), (seq, outcomes[seq])
        b = after[seq]
        assert (b.status, b.failures) == ("queued", 1), (seq, b)
        assert "is not this batch's output" in b.error and why in b.error, (seq, b.error)
        assert "move the object away, then `regen retry --dead`" in b.error
    assert outcomes[5].status == "done" and after[5].status == "done"
    with sessions() as s:
        statuses = dict(s.execute(text("SELECT batch_id, string_agg(DISTINCT status, ',') FROM samples "
                                       "GROUP BY batch_id")).all())
    assert {seq: statuses[after[seq].id] for seq in after} == {1: "pending", 2: "pending", 3: "pending",
                                                               4: "pending", 5: "failed"}


def test_a_commit_records_its_batchs_own_samples_all_of_them_or_nothing(settings, sessions, s3_bucket, tmp_path):
    submit(settings, sessions, tmp_path, s3_bucket, run="c", n=8, batch_size=4)
    first, second = _batches(sessions, "c")
    claim = claim_batch(sessions, first.id, worker="w", lease_s=LEASE_S)

    def commit(rows):
        return commit_batch(sessions, run_id=first.run_id, batch_id=first.id, attempt=claim.attempt,
                            output_key="s3://x/o", output_sha256="0" * 64, rows=rows)

    # The other batch's samples (same run, content-hash ids): refused, neither batch touched.
    with pytest.raises(IncompleteCommit, match=f"batch {first.id}: its 4 rows recorded 0 of its 4 samples"):
        commit(_rows(second.ids, run="c", config_hash=first.config_hash))
    with pytest.raises(IncompleteCommit, match="recorded 3 of its 4"):
        commit(_rows(first.ids[:3], run="c", config_hash=first.config_hash))
    with pytest.raises(IncompleteCommit, match="its 5 rows recorded 4 of its 4"):  # and one of the other batch's
        commit(_rows([*first.ids, second.ids[0]], run="c", config_hash=first.config_hash))
    assert [(b.status, b.error) for b in _batches(sessions, "c")] == [("running", None), ("queued", None)]
    with sessions() as s:
        assert s.scalar(text("SELECT count(*) FROM samples WHERE status <> 'pending'")) == 0
    # Its own, a NUL in the error string (a template's message) and in a stop reason: committed, escaped.
    rows = _rows(first.ids, run="c", config_hash=first.config_hash, detail="bad byte \x00 here")
    rows[0]["stop_reason"] = "</s\x00>"
    assert commit(rows)
    with sessions() as s:
        got = s.execute(text("SELECT status, error, stop_reason FROM samples WHERE batch_id = :b ORDER BY sample_id"),
                        {"b": first.id}).all()
    assert [g.status for g in got] == ["failed"] * 4
    assert got[0].error == "template_error: bad byte \\u0000 here" and got[0].stop_reason == "</s\\u0000>"
    # A batch's failure whose message quotes one (an exception raised on a template's output): recorded.
    claim = claim_batch(sessions, second.id, worker="w", lease_s=LEASE_S)
    assert fail_batch(sessions, second.id, claim.attempt, error="TemplateError: \x00", max_attempts=3).value == "queued"
    assert _batches(sessions, "c")[1].error == "TemplateError: \\u0000"


def test_retry_dead_keeps_dead_a_batch_whose_output_key_holds_a_shard_that_is_not_its(settings, sessions, s3_bucket,
                                                                                      tmp_path, runtime):
    store = ObjectStore()
    _submit(settings, sessions, tmp_path, f"{s3_bucket}/d", run="d", n=8, prefix="d")
    first, second = _batches(sessions, "d")
    foreign = output_shard_url(first.output_url, first.seq)
    store.put(foreign, encode_shard(_rows(["x1", "x2", "x3", "x4"], run="d", config_hash=first.config_hash)))
    with sessions.begin() as s:  # both dead after their attempts: one on the foreign shard, one on anything else
        s.execute(text("UPDATE batches SET status = 'dead', failures = 3 WHERE run_id = :r"), {"r": first.run_id})
    report = retry_dead(sessions, make_celery(settings), store, "d")
    # A replay would only find the same shard again: kept dead, said why; the other is queued.
    assert report.queued == 1 and len(report.kept_dead) == 1
    assert report.kept_dead[0].startswith(f"batch {first.seq} kept dead: the object at {foreign} is not this batch's")
    assert [(b.seq, b.status) for b in _batches(sessions, "d")] == [(1, "dead"), (2, "queued")]
    store.delete(foreign)  # what the line says to do
    assert retry_dead(sessions, make_celery(settings), store, "d").queued == 1


def test_retry_failed_takes_the_submit_lock_and_never_overwrites_an_input_object(settings, sessions, s3_bucket,
                                                                                  tmp_path):
    store = ObjectStore()
    _submit(settings, sessions, tmp_path, f"{s3_bucket}/f", run="f", n=4, prefix="f")
    [batch] = _batches(sessions, "f")
    claim = claim_batch(sessions, batch.id, worker="w", lease_s=LEASE_S)
    assert commit_batch(sessions, run_id=batch.run_id, batch_id=batch.id, attempt=claim.attempt,
                        output_key="s3://x/o", output_sha256="0" * 64,
                        rows=_rows(batch.ids, run="f", config_hash=batch.config_hash))
    app = make_celery(settings)
    # A submit of the run in progress: its lock is held, so the retry is refused, nothing written.
    with sessions.kw["bind"].connect() as other:
        other.execute(text("SELECT pg_advisory_xact_lock(8151, :r)"), {"r": batch.run_id})
        with pytest.raises(SubmitInProgress, match="a submit or retry of run 'f' is in progress"):
            retry_failed(sessions, app, store, "f")
    assert len(_batches(sessions, "f")) == 1
    # An object at the next seq's input key (a crashed retry's, say): left as it is, the batch takes seq 3.
    squatter = input_shard_url(batch.output_url, 2)
    store.put(squatter, b"not ours")
    report = retry_failed(sessions, app, store, "f")
    assert (report.failed_samples, report.new_batches) == (4, 1)
    assert store.get(squatter) == b"not ours"
    new = _batches(sessions, "f")[-1]
    assert (new.seq, new.input_key) == (3, input_shard_url(batch.output_url, 3))
    assert sorted(r["sample_id"] for r in decode_shard(store.get(new.input_key))) == sorted(batch.ids)
