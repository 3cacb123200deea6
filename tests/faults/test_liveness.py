"""Liveness never waits behind work (issue 36): heartbeats keep every lease while the ledger is slow.

A worker process's task threads share a small pool (worker/process/runtime.py). When the
ledger slows down, commits hold those connections and the other threads queue for them;
the heartbeat, which keeps the leases of every batch the process holds, must not queue
with them, or a slow ledger turns into lease expiries, each one a failure counted.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
import redis as redis_lib
from sqlalchemy import text

from ledger.dispatch import make_celery
from ledger.objects import ObjectStore
from ledger.reconcile import expire_leases, reconcile_once, top_up
from producer.run_config import build_run_config
from producer.submit import submit_run
from tests.faults.ledger_setup import submit, write_dataset
from tests.support.helpers import wait_for
from worker.batches.ledger_calls import ClaimOutcome, claim_batch, commit_batch
from worker.process.options import WorkerOptions
from worker.process.runtime import DB_MAX_OVERFLOW, DB_POOL_SIZE, LIVENESS_POOL_SIZE, WorkerRuntime

pytestmark = pytest.mark.slow

#: Batches the process holds: above the 200 the issue asks for, an H200's derived 122 and more.
HELD = 240
#: Of them, committing while the ledger is slowed: enough to take every connection of the pool
#: and leave the rest queued for it, as a worker whose commits land in a slow ledger does.
COMMITTING = 24
#: How long the test holds the lock that stalls every commit: longer than the lease, so a
#: heartbeat that waits behind the commits loses every lease (the 20 s the issue names).
STALL_S = 20.0
#: The test's lease and heartbeat: the production ratio (6 heartbeats a lease) scaled down, so
#: 20 s of stall is 2.5 leases without the test waiting the production 30 s lease several times.
LEASE_S, HEARTBEAT_S = 8.0, 1.0


def _rows(sessions, batch_id: int) -> list[dict]:
    with sessions() as s:
        ids = s.execute(text("SELECT sample_id FROM samples WHERE batch_id = :b"), {"b": batch_id}).scalars().all()
    return [{"sample_id": i, "status": "done", "finish_reason": "stop", "turns": 1, "tool_calls": 0,
             "usage": {"prompt_tokens": 3, "completion_tokens": 5, "reasoning_tokens": 0, "answer_tokens": 5}}
            for i in ids]


def test_heartbeats_keep_every_lease_while_commits_wait_on_a_stalled_ledger(settings, sessions, tmp_path,
                                                                             s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket, run="slow", n=HELD, batch_size=1)
    rt = WorkerRuntime(settings, WorkerOptions(name="w@liveness", lease_s=LEASE_S, heartbeat_s=HEARTBEAT_S,
                                               reconcile_s=0))
    assert (rt.db.pool.size(), rt.db.pool._max_overflow) == (DB_POOL_SIZE, DB_MAX_OVERFLOW), "not production's pool"
    assert (rt.liveness_db.pool.size(), rt.liveness_db.pool._max_overflow) == (LIVENESS_POOL_SIZE, 0)
    with sessions() as s:
        ids = s.execute(text("SELECT id FROM batches ORDER BY seq")).scalars().all()
        run_id = s.execute(text("SELECT id FROM runs WHERE name = 'slow'")).scalar_one()
    # Heartbeats first: claiming 240 batches one by one may take longer than a lease on a loaded machine.
    rt.start_heartbeats()
    attempts = {}
    for batch_id in ids:
        claim = claim_batch(rt.sessions, batch_id, worker=rt.options.name, lease_s=LEASE_S)
        assert claim.outcome is ClaimOutcome.CLAIMED
        attempts[batch_id] = claim.attempt
        rt.held.hold(batch_id, claim.attempt)
    rows = {b: _rows(sessions, b) for b in ids[:COMMITTING]}

    # The stall: the run's pending-samples counter row locked, as a long transaction would hold it. Every
    # commit's samples update waits for it (the counts trigger, migration 0005), holding its connection.
    locker = psycopg.connect(settings.database_url.replace("+psycopg", ""), autocommit=False)
    locker.execute("SELECT n FROM run_sample_counts WHERE run_id = %s AND status = 'pending' FOR UPDATE", (run_id,))
    committed: dict[int, bool] = {}

    def commit(batch_id: int) -> None:
        committed[batch_id] = commit_batch(rt.sessions, run_id=run_id, batch_id=batch_id,
                                           attempt=attempts[batch_id], output_key=f"s3://x/{batch_id}",
                                           output_sha256="0" * 64, rows=rows[batch_id])
        rt.held.drop(batch_id, attempts[batch_id])

    threads = [threading.Thread(target=commit, args=(b,), daemon=True) for b in ids[:COMMITTING]]
    for t in threads:
        t.start()
    # Another worker's reconciler, on connections of its own: what it would expire, it expires.
    expired, records = 0, redis_lib.Redis.from_url(settings.redis_url)  # the hand-back records: none here
    stall_ends = time.monotonic() + STALL_S
    try:
        while time.monotonic() < stall_ends:
            time.sleep(0.5)
            with sessions.begin() as s:
                expired += expire_leases(s, records, lease_s=LEASE_S, max_attempts=3)[0]
        # The premise: the stall held, every commit still waits, and they took the whole task pool.
        stalled, pool_taken = not committed, rt.db.pool.checkedout()
    finally:
        locker.rollback()
        locker.close()
    assert stalled, f"commits finished during the stall: {sorted(committed)}"
    assert pool_taken == DB_POOL_SIZE + DB_MAX_OVERFLOW, f"{pool_taken} connections of the task pool taken"
    for t in threads:
        t.join(timeout=60)
    with sessions.begin() as s:
        expired += expire_leases(s, records, lease_s=LEASE_S, max_attempts=3)[0]
        failures = s.execute(text("SELECT coalesce(sum(failures), 0) FROM batches")).scalar_one()
        running = s.execute(text("SELECT count(*) FROM batches WHERE status = 'running'")).scalar_one()
    rt.begin_shutdown()
    rt.close()
    assert expired == 0 and failures == 0, f"{expired} leases expired, {failures} failures counted"
    assert committed == {b: True for b in ids[:COMMITTING]}
    assert running == HELD - COMMITTING


def _batch_of(raw: bytes) -> int:
    import json

    return json.loads(raw)["headers"]["regen_batch"]


def _a_pass(sessions, app) -> int:
    report = reconcile_once(sessions, app, lease_s=60, max_attempts=3, window=3, grace_s=60)
    assert report is not None, "no pass ran"
    return report.topped_up


def _a_top_up(sessions, app) -> int:
    # What `regen submit` and `regen requeue` run (run_id None: every active run's queue, as requeue's may).
    return top_up(sessions, app, window=3)


@pytest.mark.parametrize("publisher", [_a_pass, _a_top_up], ids=["reconciler_pass", "top_up"])
def test_a_publisher_publishes_nothing_while_it_holds_its_batches_locks(publisher, settings, sessions, tmp_path,
                                                                         s3_bucket):
    """A message out while the transaction that marked its batch is still open sends its claimer to wait on it."""
    app, client = make_celery(settings), redis_lib.Redis.from_url(settings.redis_url)
    for queue in ("qa", "qb"):  # a pass handles its queues in name order: qa, then qb
        submit_run(sessions, app, ObjectStore(), [str(write_dataset(tmp_path / f"{queue}.jsonl", 5))],
                   run_name=f"run-{queue}", config=build_run_config("tiny", max_tokens=16, seed=1),
                   output_url=f"{s3_bucket}/{queue}", batch_size=1, queue=queue, window=1)
    assert (client.llen("qa"), client.llen("qb")) == (1, 1)
    # A lock on one of qb's planned batches: the pass tops qa up, then waits on it, its transaction open.
    locker = psycopg.connect(settings.database_url, autocommit=False)
    locker.execute("SELECT b.id FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.queue = 'qb' "
                   "AND b.status = 'planned' ORDER BY b.seq LIMIT 1 FOR UPDATE OF b")
    report: dict = {}
    pass_ = threading.Thread(target=lambda: report.update(topped_up=publisher(sessions, app)), daemon=True)
    pass_.start()
    try:
        wait_for(lambda: _waiting_on_a_lock(sessions), timeout_s=30, what="the publisher waiting on qb's locked batch",
                 interval_s=0.05)
        waiting = [_batch_of(raw) for raw in client.lrange("qa", 0, -1)]
        with psycopg.connect(settings.database_url, autocommit=False) as probe:
            # The premise: the pass has taken 2 of qa's 4 planned batches, their rows locked by its open transaction.
            free = probe.execute("SELECT count(*) FROM (SELECT b.id FROM batches b JOIN runs r ON r.id = b.run_id "
                                 "WHERE r.queue = 'qa' AND b.status = 'planned' FOR UPDATE OF b SKIP LOCKED) f"
                                 ).fetchone()[0]
            assert free == 2, f"{4 - free} of qa's planned batches locked by the pass, not 2"
            probe.rollback()
            # Every message a worker could take now is claimable at once: none of its rows is the pass's.
            for batch_id in waiting:
                probe.execute("SELECT 1 FROM batches WHERE id = %s FOR UPDATE NOWAIT", (batch_id,))
        assert len(waiting) == 1, f"{len(waiting) - 1} messages published before the transaction committed"
    finally:
        locker.rollback()
        locker.close()
        pass_.join(timeout=30)
    assert report["topped_up"] == 4 and (client.llen("qa"), client.llen("qb")) == (3, 3)


def _waiting_on_a_lock(sessions) -> bool:
    with sessions() as s:
        return bool(s.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                   "AND query LIKE '%status = ''queued''%'")).scalar_one())
