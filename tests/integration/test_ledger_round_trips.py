"""The ledger round trips of a batch's hot path, counted against the real Postgres (fake engine, moto S3).

Every batch claims and commits: on a 1,000-GPU farm the commit runs ~200 times a second, so a
statement or a transaction less on either path is load the ledger does not carry. The claim
returns the batch's crash suspects in its own statement (ledger/crash_suspects.py), and the
commit's check of its sample count comes back from the statement that records the samples
(worker/batches/ledger_calls.py ``commit_batch``). Counted with SQLAlchemy's engine events.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from sqlalchemy import event, text

from ledger.crash_suspects import ENGINE_CRASH, record_crash
from ledger.db import make_engine, make_sessionmaker
from ledger.dispatch import BatchMessage, make_celery
from ledger.objects import ObjectStore
from producer.run_config import build_run_config
from producer.submit import submit_run
from tests.faults.ledger_setup import submit, write_dataset
from worker.batches.delivery import run_batch
from worker.batches.ledger_calls import IncompleteCommit, claim_batch, commit_batch
from worker.process.options import WorkerOptions
from worker.process.runtime import WorkerRuntime

LEASE_S = 60.0
#: A fake engine that ends a batch of 4 at once.
FAST_ENGINE = "tok_s=100000,seqs=64,mean=4,sigma=0"


@contextlib.contextmanager
def _transactions(engine):
    """The statements ``engine`` sends, one list per transaction (a statement outside one starts its own)."""
    seen: list[list[str]] = []

    def begin(conn) -> None:
        seen.append([])

    def before(conn, cursor, statement, parameters, context, executemany) -> None:
        if not seen:
            seen.append([])
        seen[-1].append(" ".join(statement.split()))

    event.listen(engine, "begin", begin)
    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "begin", begin)


def _batch(sessions, run: str):
    with sessions() as s:
        return s.execute(text(
            "SELECT b.id, b.seq, b.run_id, b.input_key, r.name, "
            "array(SELECT sample_id FROM samples WHERE batch_id = b.id ORDER BY sample_id) AS ids "
            "FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = :n ORDER BY b.seq LIMIT 1"), {"n": run}).one()


def test_a_claim_reads_its_crash_suspects_in_its_own_statement_and_nothing_else_reaches_the_ledger_before_its_commit(
        settings, sessions, s3_bucket, tmp_path):
    data = write_dataset(tmp_path / "s.jsonl", 4, prefix="s")
    submit_run(sessions, make_celery(settings), ObjectStore(), [str(data)], run_name="sus",
               config=build_run_config("tiny", max_tokens=16, seed=1), output_url=f"{s3_bucket}/sus", batch_size=4,
               queue="regen", benchmark=True)
    batch = _batch(sessions, "sus")
    condemned, suspect = batch.ids[0], batch.ids[1]
    with sessions.begin() as s:  # three earlier engine deaths: one sample isolated at two of them, one in flight once
        record_crash(s, batch.id, {condemned, suspect}, isolated=(), worker="old")
        for _ in range(2):
            record_crash(s, batch.id, {condemned}, isolated={condemned}, worker="old")
    rt = WorkerRuntime(dataclasses.replace(settings), WorkerOptions(
        name="w@rt", lease_s=LEASE_S, heartbeat_s=5.0, reconcile_s=0, fake_engine=FAST_ENGINE))
    msg = BatchMessage(run=batch.name, run_id=batch.run_id, batch_id=batch.id, seq=batch.seq,
                       input_key=batch.input_key)
    try:
        with _transactions(rt.db) as transactions:
            outcome = run_batch(rt, msg)
    finally:
        rt.begin_shutdown()
        rt.close()
    assert outcome.status == "done", outcome
    with sessions() as s:
        samples = dict(s.execute(text("SELECT sample_id, status || coalesce(': ' || error, '') FROM samples "
                                      "WHERE batch_id = :b"), {"b": batch.id}).all())
    # What the suspects make the attempt do is as before: the condemned failed unrun, the rest done.
    assert samples.pop(condemned).startswith(f"failed: {ENGINE_CRASH}")
    assert set(samples.values()) == {"done"}, samples
    # The suspects come back with the claim, from its own statement: read at the claim, nothing recorded after it
    # can differ from what the attempt runs with, and no transaction of its own is spent on them.
    claim, commit, *_ = transactions
    assert claim[0].startswith("UPDATE batches b SET status = 'running'") and "engine_crash_suspects" in claim[0]
    assert [st for tx in transactions for st in tx if "engine_crash_suspects" in st] == [claim[0]]
    # From the claim to the commit nothing reaches the ledger (heartbeats have a connection of their own).
    assert any(st.startswith("WITH written AS ( UPDATE samples") for st in commit), transactions[:3]


def test_a_commit_checks_its_sample_count_in_the_statement_that_records_its_samples(settings, sessions, s3_bucket,
                                                                                    tmp_path):
    submit(settings, sessions, tmp_path, s3_bucket, run="cnt", n=4, batch_size=4)
    batch = _batch(sessions, "cnt")
    engine = make_engine(settings)
    counted = make_sessionmaker(engine)
    rows = [{"sample_id": sid, "status": "done", "finish_reason": "stop", "stop_reason": None, "turns": 1,
             "tool_calls": 0, "quality": "ok", "error": None,
             "usage": {"prompt_tokens": 3, "completion_tokens": 5, "reasoning_tokens": 0, "answer_tokens": 5}}
            for sid in batch.ids]

    def commit(rows: list[dict]) -> bool:
        return commit_batch(counted, run_id=batch.run_id, batch_id=batch.id, attempt=claim.attempt,
                            output_key="s3://x/o", output_sha256="0" * 64, rows=rows)

    try:
        claim = claim_batch(counted, batch.id, worker="w", lease_s=LEASE_S)
        # A short shard, or an empty one, is refused by what the samples' statement returned: rolled back after it.
        for short in (rows[:3], []):
            with _transactions(engine) as refused, pytest.raises(
                    IncompleteCommit, match=f"batch {batch.id}: its {len(short)} rows recorded {len(short)} of its 4"):
                commit(short)
            assert [len(tx) for tx in refused] == [1], refused
        with _transactions(engine) as transactions:
            assert commit(rows)
    finally:
        engine.dispose()
    [done] = transactions[:1]
    # Two statements: the samples (which return how many they wrote and the batch's n_samples), then the batch.
    assert len(done) == 2, done
    assert done[0].startswith("WITH written AS ( UPDATE samples") and "n_samples" in done[0]
    assert done[1].startswith("UPDATE batches SET status = 'done'")
    with sessions() as s:
        assert s.scalar(text("SELECT status FROM batches WHERE id = :b"), {"b": batch.id}) == "done"
        assert s.scalar(text("SELECT count(*) FROM samples WHERE batch_id = :b AND status = 'done'"),
                        {"b": batch.id}) == 4
