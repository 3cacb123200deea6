"""bench/farm.py's smallest configuration end to end: 8 simulated GPUs' worker processes through a real
PgBouncer, moto and a Redis of its own, for a few seconds; its table must show the calls it timed, the
answers that ended in its window, and no p99 it cannot have. And a bench killed with SIGKILL while its
workers hold batches leaves no process behind.

~45 s each on 2 cores. Skipped without the pgbouncer binary, failed under CI (as tests/fixtures/pgbouncer.py).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg
import pytest

from bench import farm
from tests.support.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pgbouncer_binary() -> None:
    if not (shutil.which("pgbouncer") or os.access("/usr/sbin/pgbouncer", os.X_OK)):
        if os.environ.get("CI"):
            pytest.fail("CI must provide pgbouncer (.ci/run installs it)", pytrace=False)
        pytest.skip("the pgbouncer binary is not installed (apt-get install pgbouncer)")


def test_the_farm_bench_times_the_ledger_calls_of_eight_simulated_gpus(pg_server, pgbouncer_binary, capsys):
    assert farm.main(["--gpus", "8", "--samples", "3200", "--warm-s", "25", "--measure-s", "10",
                      "--admin-dsn", pg_server.admin_dsn, "--pool-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "== 8 simulated GPUs, full path: 8 worker processes x 1 GPUs" in out, out
    commits = float(re.search(r"commits ([\d.]+)/s of the farm's", out).group(1))
    assert commits > 0, out
    # Throughput from the answers that ended in the window, never above what the engines can make
    # (but for the answers in progress at the window's start: a few percent).
    ended, tok_share = re.search(r"answers ended in the window: ([\d,]+) = .* \((\d+)%\)$", out, re.MULTILINE).groups()
    assert int(ended.replace(",", "")) > 0 and int(tok_share) <= 110, out
    rows = {m.group(1): m for m in re.finditer(r"^(claim|heartbeat|commit|gate)\s+([\d,]+)\s+[\d.]+\s+[\d.]+\s+"
                                                r"(max of \d+|[\d.]+)\s", out, re.MULTILINE)}
    assert set(rows) == {"claim", "heartbeat", "commit", "gate"}, out
    for m in rows.values():  # a 10-s window has far fewer than 200 calls of a kind: no p99, the max of n
        assert m.group(3) == f"max of {int(m.group(2).replace(',', ''))}", out
    # PgBouncer held the ledger to its pool, however many clients the 8 processes opened.
    server = int(re.search(r"server peak (\d+) \(PgBouncer pool 4\)", out).group(1))
    assert 1 <= server <= 4, out
    assert "== summary" in out


def _alive(pids: set[int]) -> list[str]:
    """Those of ``pids`` still running (a zombie is dead: only its entry waits for a parent's wait)."""
    left = []
    for pid in sorted(pids):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {' '.join(p.cmdline())[:100]}")
        except psutil.NoSuchProcess:
            pass
    return left


def _farm_databases(admin_dsn: str) -> set[str]:
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as admin:
        return {r[0] for r in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'regen_farm_%'")}


def _running_batches(admin_dsn: str, before: set[str]) -> int:
    """Batches held by the farm's workers, in this bench's scratch ledger: a database not in ``before``.

    A bench killed with SIGKILL cannot drop its database, so on a Postgres that outlives the session
    (the machine's) an earlier run of this test leaves one, with batches still 'running', which would
    make the premise true before this bench had started anything (seen)."""
    held = 0
    for name in _farm_databases(admin_dsn) - before:
        dsn = re.sub(r"/[^/?]*(\?|$)", f"/{name}\\1", admin_dsn, count=1)
        try:
            with psycopg.connect(dsn, connect_timeout=5) as conn:
                held += conn.execute("SELECT count(*) FROM batches b JOIN runs r ON r.id = b.run_id "
                                     "WHERE b.status = 'running' AND r.name = 'farm-window'").fetchone()[0]
        except psycopg.Error:
            pass  # being created or dropped
    return held


def test_a_farm_bench_killed_with_sigkill_leaves_no_process(pg_server, pgbouncer_binary, tmp_path):
    before = _farm_databases(pg_server.admin_dsn)
    log = open(tmp_path / "bench.log", "wb")
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.farm", "--gpus", "8", "--samples", "3200", "--warm-s", "120", "--measure-s",
         "120", "--admin-dsn", pg_server.admin_dsn, "--pool-size", "4"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT)
    try:
        # The premise: the kill lands while the 8 workers run and hold batches, beside PgBouncer,
        # moto, Redis and the reaper (12 processes at least).
        wait_for(lambda: _running_batches(pg_server.admin_dsn, before) > 0, timeout_s=240, interval_s=1.0,
                 what="the farm's workers holding batches",
                 on_timeout=lambda: (tmp_path / "bench.log").read_text(errors="replace")[-3000:])
        started = _described(psutil.Process(bench.pid).children(recursive=True))
        services = ("moto", "redis-server", "pgbouncer", "worker.process.reaper")
        workers = [pid for pid, ppid, cmd in started if ppid == bench.pid and not any(s in cmd for s in services)]
        assert len(started) >= 12 and len(workers) >= 8, [f"{pid} {cmd[:120]}" for pid, _, cmd in started]
        pids = {pid for pid, _, _ in started}
        bench.send_signal(signal.SIGKILL)
        bench.wait(10)
        # The reaper's bound is ~20 s (worker/process/reaper.py); the wait gives a loaded machine room.
        wait_for(lambda: not _alive(pids), timeout_s=90, interval_s=0.5, what="every process of the bench gone",
                 on_timeout=lambda: "\n".join(_alive(pids)))
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        log.close()
        _drop(pg_server.admin_dsn, _farm_databases(pg_server.admin_dsn) - before)  # what the SIGKILL left


def _described(procs: list[psutil.Process]) -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of each process still there when looked at: a short-lived helper
    may end between the listing and the look (CI once failed on one with NoSuchProcess)."""
    out = []
    for p in procs:
        try:
            out.append((p.pid, p.ppid(), " ".join(p.cmdline())))
        except psutil.NoSuchProcess:
            pass
    return out


def _drop(admin_dsn: str, names: set[str]) -> None:
    """Drop the scratch databases a killed bench could not (its workers are gone by now)."""
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
