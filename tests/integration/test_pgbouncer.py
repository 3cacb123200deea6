"""The ledger's work through a real PgBouncer in transaction mode, as the compose stack runs it.

Claims, heartbeats and commits from many threads, more client connections than the pooler
has server connections, statements repeated past psycopg's prepare threshold, the submit's
advisory lock: all of it must work, and Postgres must never see more connections for the
database than the pool allows.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
from sqlalchemy import text

from ledger import transitions
from ledger.db import make_engine, make_sessionmaker
from ledger.settings import Settings
from worker.batches.ledger_calls import ClaimOutcome, claim_batch, commit_batch, heartbeat

THREADS = 12
BATCHES = 48
SAMPLES = 4


def _server_connections(admin_dsn: str, database: str) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                             "AND backend_type = 'client backend'", (database,)).fetchone()[0]


def _row(sid: str) -> dict:
    return {"sample_id": sid, "status": "done", "finish_reason": "stop", "turns": 1, "tool_calls": 0,
            "quality": "ok", "usage": {"prompt_tokens": 3, "completion_tokens": 5}}


@pytest.fixture
def pooled(pgbouncer, database_url):
    engine = make_engine(Settings(database_url=pgbouncer.url, database_pooler="transaction"),
                         pool_size=THREADS, max_overflow=0)
    yield make_sessionmaker(engine)
    engine.dispose()


def test_claims_heartbeats_commits_and_locks_work_through_the_pooler_within_its_connections(pgbouncer, pooled,
                                                                                           pg_server):
    sessions = pooled
    with sessions.begin() as s:
        run = s.execute(text(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
            "VALUES ('pooled', 'm', '{}', 'h', 's3://b/x', 'regen', 4, 'active') RETURNING id")).scalar_one()
        ids = transitions.insert_batches(s, run, [(i + 1, f"k{i}", SAMPLES) for i in range(BATCHES)],
                                         status=transitions.BatchStatus.QUEUED)
        transitions.copy_pending_samples(s, run, ((f"s{b}-{j}", bid, "f", j) for b, bid in enumerate(ids)
                                                   for j in range(SAMPLES)))

    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], _server_connections(pg_server.admin_dsn, pgbouncer.database))

    errors: list[BaseException] = []
    todo = list(enumerate(ids))
    lock = threading.Lock()

    def work() -> None:
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    b, bid = todo.pop()
                claim = claim_batch(sessions, bid, worker=f"t{b}", lease_s=30)
                assert claim.outcome is ClaimOutcome.CLAIMED
                for _ in range(6):  # past psycopg's prepare threshold (5) on the same statement
                    assert heartbeat(sessions, {bid: claim.attempt}) == set()
                assert commit_batch(sessions, run_id=run, batch_id=bid, attempt=claim.attempt,
                                    output_key=f"o{b}", output_sha256="0" * 64,
                                    rows=[_row(f"s{b}-{j}") for j in range(SAMPLES)])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert errors == []

    with sessions() as s:
        status, open_batches = s.execute(text("SELECT status, (SELECT sum(open_batches) FROM run_batch_counts "
                                              "WHERE run_id = :r) FROM runs WHERE id = :r"), {"r": run}).one()
        done = s.execute(text("SELECT sum(n) FROM run_sample_counts WHERE run_id = :r AND status = 'done' "
                              "AND quality = 'ok'"), {"r": run}).scalar()
    # Every commit landed, the last one of them finished the run, the counts are exact.
    assert (status, open_batches, done) == ("finished", 0, BATCHES * SAMPLES)
    assert 0 < peak[0] <= pgbouncer.pool_size, f"{peak[0]} server connections for a pool of {pgbouncer.pool_size}"

    # The submit's lock is transaction-level: held while its transaction is open, on whichever
    # server connection that is, and gone with it (a session lock would stay on a pooled one).
    holder = sessions.kw["bind"].connect()
    assert holder.execute(text("SELECT pg_try_advisory_xact_lock(8151, :r)"), {"r": run}).scalar()
    with sessions.begin() as s:
        assert not s.execute(text("SELECT pg_try_advisory_xact_lock(8151, :r)"), {"r": run}).scalar()
    holder.close()
    with sessions.begin() as s:
        assert s.execute(text("SELECT pg_try_advisory_xact_lock(8151, :r)"), {"r": run}).scalar()
