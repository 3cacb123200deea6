"""Hand-backs and claims cost no failure (issue 36, part 4), against the real Postgres (no vLLM engine).

The ledger's network is broken the way a real one breaks, through a TCP proxy in front of the
test's Postgres (tests/support/pg_proxy.py): every connection dropped and new ones refused, or
one connection cut at its COMMIT, before the server saw it or after it committed. The last two
tests run real worker processes (``python -m worker.process.consumer`` with the fake engine, on
a benchmark run) and signal them as a node does: SIGTERM with the ledger cut off, and SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest
import redis as redis_lib
from sqlalchemy import create_engine, make_url, text

from ledger import handbacks
from ledger.crash_suspects import Suspects, record_crash
from ledger.db import make_sessionmaker
from ledger.dispatch import BatchMessage, make_celery
from ledger.handbacks import KEY, record_hand_back
from ledger.objects import ObjectStore
from ledger.reconcile import reconcile_once
from ledger.settings import sqlalchemy_url
from producer.run_config import build_run_config
from producer.submit import submit_run
from tests.faults.ledger_setup import submit, write_dataset
from tests.support.helpers import ROOT, cli_env, wait_for
from tests.support.pg_proxy import PgProxy
from worker.batches.delivery import Requeue, _hand_back, run_batch
from worker.batches.ledger_calls import ClaimOutcome, claim_batch, heartbeat
from worker.process.options import HAND_BACK_S, WorkerOptions
from worker.process.reaper import REAP_GRACE_S
from worker.process.runtime import WorkerRuntime

LEASE_S = 30.0


@pytest.fixture
def proxy(settings):
    url = make_url(settings.database_url)  # with or without user@ (the machine's server has none)
    p = PgProxy(url.host or "127.0.0.1", int(url.port or 5432))
    yield p
    p.close()


def _proxied_sessions(proxy: PgProxy, settings):
    engine = create_engine(sqlalchemy_url(proxy.url(settings.database_url)), pool_pre_ping=True, pool_size=1,
                           max_overflow=0)
    return engine, make_sessionmaker(engine)


def _batch(sessions, seq: int = 1):
    with sessions() as s:
        return s.execute(text("SELECT b.id, b.seq, b.run_id, b.input_key, r.name FROM batches b "
                              "JOIN runs r ON r.id = b.run_id ORDER BY b.seq OFFSET :o LIMIT 1"),
                         {"o": seq - 1}).one()


def _row(sessions, batch_id: int):
    with sessions() as s:
        return s.execute(text("SELECT status, attempts, failures, worker, stale_deliveries, heartbeat_at, error "
                              "FROM batches WHERE id = :b"), {"b": batch_id}).one()


@pytest.mark.parametrize("where", ["after", "before"])
def test_a_claim_whose_commit_got_no_answer_is_resolved_by_reading_the_row(where, settings, sessions, proxy,
                                                                           tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket, run="amb", n=4, batch_size=4)
    batch = _batch(sessions)
    with sessions.begin() as s:  # a sample in flight at an earlier engine death: the claim returns it
        suspect = s.scalar(text("SELECT min(sample_id) FROM samples WHERE batch_id = :b"), {"b": batch.id})
        record_crash(s, batch.id, {suspect}, isolated=(), worker="old")
    engine, proxied = _proxied_sessions(proxy, settings)
    try:
        proxy.cut_next_commit(where)
        claim = claim_batch(proxied, batch.id, worker="w@amb", lease_s=LEASE_S)
    finally:
        engine.dispose()
    # The premise: the claim's COMMIT was cut, on the side the test means.
    assert proxy.cuts == {"before": int(where == "before"), "after": int(where == "after")}
    row = _row(sessions, batch.id)
    # Ours either way: committed (read back) or not (claimed again); never "held elsewhere", never a stale delivery.
    assert claim.outcome is ClaimOutcome.CLAIMED, claim
    assert (row.status, row.attempts, row.worker, row.stale_deliveries) == ("running", claim.attempt, "w@amb", 0)
    assert claim.attempt == 1
    # Its crash suspects come with it either way: from the statement whose COMMIT was cut, or from the claim again.
    assert claim.suspects == Suspects(isolate=frozenset({suspect}))


def test_a_heartbeat_skips_a_locked_row_renews_the_others_and_does_not_call_it_lost(settings, sessions, tmp_path,
                                                                                     s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket, run="hb", n=3, batch_size=1)
    held = {}
    for seq in (1, 2, 3):
        b = _batch(sessions, seq)
        held[b.id] = claim_batch(sessions, b.id, worker="w@hb", lease_s=LEASE_S).attempt
    locked = next(iter(held))
    before = {b: _row(sessions, b).heartbeat_at for b in held}
    time.sleep(0.01)  # now() moves on: a renewed lease is a later timestamp
    locker = psycopg.connect(settings.database_url, autocommit=False)
    try:
        locker.execute("SELECT 1 FROM batches WHERE id = %s FOR UPDATE", (locked,))  # as a commit in flight holds it
        result: dict = {}
        beat = threading.Thread(target=lambda: result.update(lost=heartbeat(sessions, held)), daemon=True)
        beat.start()
        beat.join(timeout=30)
        assert not beat.is_alive(), "the heartbeat waited on the locked row"
    finally:
        locker.rollback()
        locker.close()
    assert result["lost"] == set()
    after = {b: _row(sessions, b).heartbeat_at for b in held}
    assert after[locked] == before[locked]
    assert all(after[b] > before[b] for b in held if b != locked)


def _runtime(settings, proxy: PgProxy, **options) -> WorkerRuntime:
    proxied = dataclasses.replace(settings, database_url=proxy.url(settings.database_url))
    defaults = {"name": "w@handback", "lease_s": LEASE_S, "heartbeat_s": 0.5, "reconcile_s": 0}
    return WorkerRuntime(proxied, WorkerOptions(**{**defaults, **options}))


def test_a_hand_back_whose_release_gives_up_is_retried_by_the_heartbeat_and_costs_no_failure(
        settings, sessions, proxy, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket, run="hb2", n=4, batch_size=4)
    batch = _batch(sessions)
    rt = _runtime(settings, proxy, release_s=1.5)
    try:
        claim = claim_batch(rt.sessions, batch.id, worker=rt.options.name, lease_s=LEASE_S)
        assert rt.held.hold(batch.id, claim.attempt)
        rt.start_heartbeats()
        proxy.down()  # the ledger is unreachable from this worker
        _hand_back(rt, batch.id, claim.attempt, "handed back before it started: test")
        rt.held.drop(batch.id, claim.attempt)  # what run_batch's finally does; its Requeue sends the message back, never an ack
        # The premise: the release gave up (the batch is still ours, running), and is remembered.
        assert rt.hand_backs.unreleased() == {(batch.id, claim.attempt)}
        assert _row(sessions, batch.id).status == "running"
        proxy.up()
        wait_for(lambda: _row(sessions, batch.id).status == "queued", timeout_s=30, interval_s=0.2,
                 what="the heartbeat releasing the batch once the ledger is back")
        row = _row(sessions, batch.id)
        assert (row.failures, row.worker, row.error) == (0, None, "handed back before it started: test")
        assert rt.hand_backs.unreleased() == set()
    finally:
        rt.begin_shutdown()
        rt.close()


def test_a_worker_does_not_take_back_its_own_hand_back_within_a_probe_period(settings, sessions, proxy, tmp_path,
                                                                           s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket, run="own", n=4, batch_size=4)
    batch = _batch(sessions)
    rt = _runtime(settings, proxy, heartbeat_s=2.0)
    msg = BatchMessage(run=batch.name, run_id=batch.run_id, batch_id=batch.id, seq=batch.seq,
                       input_key=batch.input_key)
    try:
        rt.hand_backs.handed_back(batch.id)
        assert 0 < rt.hand_backs.handed_back_recently(batch.id) <= rt.options.heartbeat_s
        with pytest.raises(Requeue, match="handed back by this worker"):
            run_batch(rt, msg)
        row = _row(sessions, batch.id)
        assert (row.status, row.attempts, row.stale_deliveries) == ("queued", 0, 0)  # not claimed, not counted
        wait_for(lambda: rt.hand_backs.handed_back_recently(batch.id) == 0, timeout_s=10, interval_s=0.1,
                 what="the probe period passing")
        # After it, the worker may take it like any other batch.
        assert claim_batch(rt.sessions, batch.id, worker=rt.options.name, lease_s=LEASE_S).outcome \
            is ClaimOutcome.CLAIMED
    finally:
        rt.begin_shutdown()
        rt.close()


def test_a_shutdowns_hand_back_ends_before_the_reapers_kill_even_with_the_ledger_gone(
        settings, sessions, proxy, tmp_path, s3_bucket):
    assert 0 < HAND_BACK_S < REAP_GRACE_S
    with pytest.raises(ValueError, match="below the reaper's grace"):
        WorkerOptions(name="w", hand_back_s=REAP_GRACE_S)
    submit(settings, sessions, tmp_path, s3_bucket, run="sd", n=4, batch_size=4)
    batch = _batch(sessions)
    rt = _runtime(settings, proxy)  # the production hand-back time
    try:
        claim = claim_batch(rt.sessions, batch.id, worker=rt.options.name, lease_s=LEASE_S)
        assert rt.held.hold(batch.id, claim.attempt)
        proxy.down()
        rt.begin_shutdown()  # the SIGTERM: the reaper's grace starts now
        started = time.monotonic()
        done = threading.Thread(target=_hand_back, args=(rt, batch.id, claim.attempt, "handed back at shutdown"),
                                kwargs={"at_shutdown": True}, daemon=True)
        done.start()
        done.join(timeout=REAP_GRACE_S)
        assert not done.is_alive(), "the hand-back was still running when the reaper's SIGKILL would come"
        took_s = time.monotonic() - started
        assert rt.hand_backs.unreleased() == {(batch.id, claim.attempt)}  # the premise: it could not land, it gave up
        print(f"hand-back gave up after {took_s:.1f} s (HAND_BACK_S {HAND_BACK_S:.0f}, reaper {REAP_GRACE_S:.0f})")
    finally:
        proxy.up()
        rt.close()
    # close() made a last try, the ledger being back: released, no failure.
    row = _row(sessions, batch.id)
    assert (row.status, row.failures) == ("queued", 0)


#: A conversation of the slow fake engine makes 1 token a second: its batch of 4 runs for ~17 minutes,
#: so it is still running whenever the test signals its worker. The fast one ends a batch at once.
SLOW_ENGINE, FAST_ENGINE = "tok_s=4,seqs=4,mean=1000,sigma=0", "tok_s=100000,seqs=64,mean=4,sigma=0"
#: The lease of the test's reconciler passes: short, so the test waits seconds for an expiry.
PASS_LEASE_S = 3.0


def _benchmark_run(settings, sessions, tmp_path, bucket: str, run: str):
    """A run of one batch of 4 samples that a fake engine may serve (``--benchmark``): its batch row."""
    data = write_dataset(tmp_path / f"{run}.jsonl", 4, prefix=run)
    submit_run(sessions, make_celery(settings), ObjectStore(), [str(data)], run_name=run,
               config=build_run_config("tiny", max_tokens=2000, seed=1), output_url=f"{bucket}/{run}",
               batch_size=4, queue="regen", benchmark=True)
    return _batch(sessions)


@contextlib.contextmanager
def _fake_worker(env: dict, log_path, *, name: str, engine: str, database_url: str):
    """A real worker process (Celery, heartbeats, hand-backs) on the fake engine, holding one batch."""
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.process.consumer", "--name", name, "--concurrency", "1",
             "--heartbeat-s", "1", "--reconcile-s", "0", "--fake-engine", engine],
            env={**env, "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}, stdout=log_file,
            stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def _expire_by_a_pass(sessions, app, log):
    """The test's reconciler passes, until one expires the batch's lease: that pass's report."""
    return wait_for(lambda: (r := reconcile_once(sessions, app, lease_s=PASS_LEASE_S, max_attempts=3)) is not None
                    and r.expired and r, timeout_s=60, interval_s=0.5, what="a pass expiring the lease",
                    on_timeout=log)


def _done_by_another_worker(settings, sessions, env, tmp_path, batch_id: int) -> None:
    with _fake_worker(env, tmp_path / "b.log", name="fb@test", engine=FAST_ENGINE,
                      database_url=settings.database_url):
        wait_for(lambda: _row(sessions, batch_id).status == "done", timeout_s=90, interval_s=0.5,
                 what="worker b doing the batch", on_timeout=lambda: (tmp_path / "b.log").read_text()[-3000:])


def test_a_sigterm_hand_back_cut_off_from_the_ledger_costs_no_failure_when_its_lease_expires(
        settings, s3_env, s3_bucket, sessions, proxy, tmp_path):
    batch = _benchmark_run(settings, sessions, tmp_path, s3_bucket, "cut")
    env, app = cli_env(settings, s3_env), make_celery(settings)
    records = redis_lib.Redis.from_url(settings.redis_url)
    log = lambda: (tmp_path / "a.log").read_text()[-4000:]  # noqa: E731
    with _fake_worker(env, tmp_path / "a.log", name="fa@cut", engine=SLOW_ENGINE,
                      database_url=proxy.url(settings.database_url)) as a:
        wait_for(lambda: "attempt 1 started" in log(), timeout_s=60, interval_s=0.2, what="a running the batch",
                 on_timeout=log)
        proxy.down()  # the ledger is unreachable from a, before and through its whole hand-back
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=60)
    # The premise: a handed the batch back but its release never landed; the ledger still has it running.
    assert "its release did not land" in log(), log()
    row = _row(sessions, batch.id)
    assert (row.status, row.attempts, row.failures, row.worker) == ("running", 1, 0, "fa@cut")
    assert records.get(KEY.format(batch=batch.id, attempt=1)) == b"fa@cut"
    # Its lease expires (another worker's pass, which reaches the ledger and Redis): as a hand-back.
    report = _expire_by_a_pass(sessions, app, log)
    assert (report.expired, report.handed_back, report.dead) == (1, 1, 0)
    row = _row(sessions, batch.id)
    assert (row.status, row.failures, row.worker) == ("queued", 0, None)
    assert "hand-back" in row.error and "no failure counted" in row.error, row.error
    _done_by_another_worker(settings, sessions, env, tmp_path, batch.id)
    row = _row(sessions, batch.id)
    assert (row.status, row.attempts, row.failures) == ("done", 2, 0)


def test_a_sigkilled_workers_batch_still_counts_its_failure_when_its_lease_expires(
        settings, s3_env, s3_bucket, sessions, tmp_path):
    batch = _benchmark_run(settings, sessions, tmp_path, s3_bucket, "kill")
    env, app = cli_env(settings, s3_env), make_celery(settings)
    records = redis_lib.Redis.from_url(settings.redis_url)
    log = lambda: (tmp_path / "a.log").read_text()[-4000:]  # noqa: E731
    with _fake_worker(env, tmp_path / "a.log", name="fa@kill", engine=SLOW_ENGINE,
                      database_url=settings.database_url) as a:
        wait_for(lambda: "attempt 1 started" in log(), timeout_s=60, interval_s=0.2, what="a running the batch",
                 on_timeout=log)
        os.kill(a.pid, signal.SIGKILL)  # lost with the batch: it may have been what killed the worker
        a.wait(timeout=30)
    assert _row(sessions, batch.id).status == "running" and records.keys("regen:handback:*") == []
    report = _expire_by_a_pass(sessions, app, log)
    assert (report.expired, report.handed_back, report.dead) == (1, 0, 0)
    row = _row(sessions, batch.id)
    assert (row.status, row.failures) == ("queued", 1)
    assert "stopped heartbeating" in row.error, row.error
    _done_by_another_worker(settings, sessions, env, tmp_path, batch.id)
    row = _row(sessions, batch.id)
    assert (row.status, row.attempts, row.failures) == ("done", 2, 1)


def test_an_expiry_excuses_only_its_workers_recorded_attempt_and_expires_nothing_it_cannot_check(
        settings, sessions, tmp_path, s3_bucket):
    submit(settings, sessions, tmp_path, s3_bucket, run="rec", n=3, batch_size=1)
    ids = [_batch(sessions, seq).id for seq in (1, 2, 3)]
    for batch_id in ids:
        assert claim_batch(sessions, batch_id, worker="w@rec", lease_s=LEASE_S).attempt == 1
    records = redis_lib.Redis.from_url(settings.redis_url)
    record_hand_back(records, ids[0], 1, worker="w@rec")    # this attempt, by its worker: a hand-back
    record_hand_back(records, ids[1], 1, worker="x@rec")    # another worker's name: not this attempt's
    record_hand_back(records, ids[2], 2, worker="w@rec")    # another attempt: not this one's
    with sessions.begin() as s:
        s.execute(text("UPDATE batches SET heartbeat_at = now() - interval '1 hour'"))
        age_s = s.execute(text("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")).scalar()
    time.sleep(max(0.0, PASS_LEASE_S + 0.5 - float(age_s)))  # no lease expires on a server younger than it
    # Records it cannot read (nothing listens on port 1): it raises before it expires anything.
    with pytest.raises(redis_lib.ConnectionError), sessions.begin() as s:
        handbacks.expire_leases(s, redis_lib.Redis(host="127.0.0.1", port=1), lease_s=PASS_LEASE_S, max_attempts=3)
    assert {_row(sessions, b).status for b in ids} == {"running"}
    with sessions.begin() as s:
        expired = {r.id: r.handed_back for r in handbacks.expire_leases(s, records, lease_s=PASS_LEASE_S,
                                                                          max_attempts=3)}
    assert expired == {ids[0]: True, ids[1]: False, ids[2]: False}
    assert [(_row(sessions, b).status, _row(sessions, b).failures) for b in ids] == [
        ("queued", 0), ("queued", 1), ("queued", 1)]
