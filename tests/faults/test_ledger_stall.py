"""A ledger that stops answering for longer than a lease, then comes back the same server (issue 58, item 3).

Every process of the test's own Postgres is frozen (SIGSTOP) for 45 s, as a frozen host, a
partition or a stalled pooler stops it answering without a restart, while a real worker
process ``w`` (the fake engine, on a benchmark run) runs two batches under 8 s leases; then it
is resumed (SIGCONT). On the ledger's clock every heartbeat is then 45 s old. A second worker
``r`` runs the farm's reconciler (it consumes another queue, so it holds no batch): its pass
after the stall lands a few seconds before ``w``'s heartbeats do (``w``'s backends are resumed
last), as on a farm some worker's pass always comes first. Before, that pass expired both
leases: a failure charged on each, ``w`` abandoning its generation, attempt 2 generating it
again. Now a worker's reconciler and claims take no lease over until its own heartbeats have
landed steadily for a lease (worker/process/heartbeat.py).

Skipped where the session's Postgres is the machine's (SIGSTOP would freeze everyone's):
``REGEN_TEST_SERVICES=embedded`` runs it on the session's own.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import psutil
import pytest
from sqlalchemy import text

from ledger.dispatch import make_celery
from ledger.objects import ObjectStore
from producer.run_config import build_run_config
from producer.submit import submit_run
from tests.faults.farm import batches_by_status, settled
from tests.faults.ledger_setup import write_dataset
from tests.support.helpers import ROOT, cli_env, stop_process, wait_for

pytestmark = pytest.mark.slow

STALL_S = 45.0
LEASE_S = 8.0
#: 1 token a second per sequence, 70 tokens each: a batch runs ~70 s, through the whole stall.
ENGINE = "tok_s=8,seqs=8,mean=70,sigma=0"


@contextlib.contextmanager
def _frozen(pg_server, *, last: set[int], last_after_s: float):
    """Every process of the session's own Postgres stopped (SIGSTOP) for the block, then resumed (SIGCONT),
    the backends ``last`` ``last_after_s`` after the others; resumed whatever the block raised."""
    postmaster = psutil.Process(pg_server.embedded.proc.pid)
    procs: list[psutil.Process] = []

    def resume(which) -> None:
        for p in which:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGCONT)

    try:
        for p in [postmaster, *postmaster.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):  # a backend that ended since the listing
                p.send_signal(signal.SIGSTOP)
                procs.append(p)
        yield procs
    finally:
        resume([p for p in procs if p.pid not in last])
        time.sleep(last_after_s)
        resume([p for p in procs if p.pid in last])


def _backends_of(sessions, pg_port: int, worker: subprocess.Popen) -> set[int]:
    """The Postgres backends serving the worker process's connections (matched by its TCP ports)."""
    ports = {c.laddr.port for c in psutil.Process(worker.pid).net_connections(kind="tcp")
             if c.raddr and c.raddr.port == pg_port}
    with sessions() as s:
        return set(s.execute(text("SELECT pid FROM pg_stat_activity WHERE client_port = ANY(:p)"),
                             {"p": list(ports)}).scalars())


def _fake_worker(settings, s3_env, log_path, *, name: str, queues: str, reconcile_s: float) -> subprocess.Popen:
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.process.consumer", "--name", name, "--queues", queues,
             "--concurrency", "2", "--lease-s", str(LEASE_S), "--heartbeat-s", "1", "--reconcile-s", str(reconcile_s),
             "--requeue-grace-s", "5", "--fake-engine", ENGINE],
            env={**cli_env(settings, s3_env), "PYTHONUNBUFFERED": "1"}, stdout=log_file, stderr=subprocess.STDOUT,
            cwd=ROOT, start_new_session=True)


def _batches(sessions, run: str):
    with sessions() as s:
        return s.execute(text("SELECT b.id, b.status, b.attempts, b.failures FROM batches b JOIN runs r "
                              "ON r.id = b.run_id WHERE r.name = :n ORDER BY b.seq"), {"n": run}).all()


def test_a_ledger_frozen_longer_than_a_lease_costs_no_failure_and_no_attempt(settings, s3_env, s3_bucket, sessions,
                                                                           pg_server, tmp_path):
    pg_server.require_own()
    data = write_dataset(tmp_path / "stall.jsonl", 8, prefix="stall")
    submit_run(sessions, make_celery(settings), ObjectStore(), [str(data)], run_name="stall",
               config=build_run_config("tiny", max_tokens=2000, seed=1), output_url=f"{s3_bucket}/stall",
               batch_size=4, queue="regen", benchmark=True)
    logs = lambda: "\n".join(f"{n}:\n" + (tmp_path / f"{n}.log").read_text()[-4000:] for n in "wr")  # noqa: E731
    w = _fake_worker(settings, s3_env, tmp_path / "w.log", name="fw@stall", queues="regen", reconcile_s=0)
    r = _fake_worker(settings, s3_env, tmp_path / "r.log", name="fr@stall", queues="other", reconcile_s=0.5)
    try:
        wait_for(lambda: batches_by_status(sessions, "stall") == {"running": 2}, timeout_s=90, interval_s=0.2,
                 what="w running both batches", on_timeout=logs)
        time.sleep(2 * LEASE_S)  # r's reconciler steady (a lease of landed heartbeats): it could expire
        before = _batches(sessions, "stall")
        assert {(b.status, b.attempts) for b in before} == {("running", 1)}
        w_backends = _backends_of(sessions, pg_server.port, w)
        assert w_backends, "w's Postgres backends were not found"
        sessions.kw["bind"].dispose()  # the test's own connections are not left waiting on the frozen server
        with _frozen(pg_server, last=w_backends, last_after_s=5.0) as procs:
            assert len(procs) > len(w_backends) + 1, "the postmaster alone: its backends were not found"
            time.sleep(STALL_S)
        wait_for(lambda: settled(sessions, "stall"), timeout_s=180, interval_s=1, what="the run settled",
                 on_timeout=logs)
    finally:
        stop_process(w)
        stop_process(r)
    after = _batches(sessions, "stall")
    assert [(b.id, b.status, b.attempts, b.failures) for b in after] == \
        [(b.id, "done", 1, 0) for b in before], f"{after}\n{logs()}"
    assert "answered no heartbeat" in (tmp_path / "r.log").read_text(), logs()
