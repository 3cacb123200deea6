"""The launcher's reaper (worker/process/reaper.py) with stand-in workers: no engine, seconds to run.

A stand-in worker starts what a vLLM engine would leave behind at its worst: a
grandchild that ignores SIGTERM (vLLM's engine core while it loads its model) and
one that left the worker's session (setsid). SIGKILL of the launcher must take all
of them, and nothing of another launcher running beside it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil

from tests.support.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]

#: A worker process: starts two stubborn grandchildren, then ignores SIGTERM too when asked
#: (a worker stuck in a C call), else exits on it like a worker that handed its batches back.
FAKE_WORKER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", stubborn])
    subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
    if os.environ.get("FAKE_WORKER_STUCK"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("fake worker up", flush=True)
    time.sleep(600)
""")

LAUNCH = textwrap.dedent("""
    import sys
    from worker.process.launcher import Launcher, ProcessPlan
    import os
    plans = [ProcessPlan(name=f"fake{i}", devices=(), env=dict(os.environ),
                         argv=(sys.executable, "-c", sys.argv[1])) for i in range(2)]
    sys.exit(Launcher(plans).run())
""")


def _marked(mark: str) -> list[psutil.Process]:
    """Live processes carrying this test's own environment mark (never matched by name)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("TEST_REAPER_MARK") == mark and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def _launch(mark: str, **env: str) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TEST_REAPER_MARK": mark, **env}
    return subprocess.Popen([sys.executable, "-c", LAUNCH, FAKE_WORKER], env=full_env, cwd=ROOT,
                            start_new_session=True)


def _cleanup(mark: str) -> None:
    for p in _marked(mark):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def test_a_killed_launcher_leaves_nothing_of_its_own_and_everything_of_another():
    mine, theirs = uuid.uuid4().hex, uuid.uuid4().hex
    # Stuck workers: the reaper's SIGTERM is ignored by every process, so only its SIGKILL after
    # the grace can end them; the bound still holds.
    launcher = _launch(mine, FAKE_WORKER_STUCK="1")
    other = _launch(theirs)
    try:
        # launcher + reaper + 2 x (worker + 2 grandchildren)
        wait_for(lambda: len(_marked(mine)) >= 8 and len(_marked(theirs)) >= 8, timeout_s=60,
                 what="both launchers' processes up", interval_s=0.2)
        before_theirs = {p.pid for p in _marked(theirs)}
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        killed_at = time.monotonic()
        wait_for(lambda: not _marked(mine), timeout_s=30, what="every process of the killed launcher gone",
                 interval_s=0.2, on_timeout=lambda: str([(p.pid, p.cmdline()) for p in _marked(mine)]))
        gone_s = time.monotonic() - killed_at
        assert gone_s < 20, f"processes outlived their launcher by {gone_s:.1f} s"
        assert {p.pid for p in _marked(theirs)} == before_theirs, "another launcher's processes were touched"
    finally:
        _cleanup(mine)
        other.send_signal(signal.SIGTERM)
        try:
            other.wait(timeout=30)
        finally:
            _cleanup(theirs)


def test_workers_that_stop_on_sigterm_are_reaped_without_waiting_the_grace():
    mark = uuid.uuid4().hex
    launcher = _launch(mark)
    try:
        wait_for(lambda: len(_marked(mark)) >= 8, timeout_s=60, what="the launcher's processes up", interval_s=0.2)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        killed_at = time.monotonic()
        wait_for(lambda: not _marked(mark), timeout_s=30, what="every process gone", interval_s=0.1)
        gone_s = time.monotonic() - killed_at
        # The workers exit at once on SIGTERM; their stubborn children are then killed, not waited for.
        assert gone_s < 5, f"took {gone_s:.1f} s: the reaper waited out its grace for workers already gone"
    finally:
        _cleanup(mark)


def test_a_launcher_that_stops_cleanly_takes_its_reaper_along():
    mark = uuid.uuid4().hex
    launcher = _launch(mark)
    try:
        wait_for(lambda: len(_marked(mark)) >= 8, timeout_s=60, what="the launcher's processes up", interval_s=0.2)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
        wait_for(lambda: not _marked(mark), timeout_s=10, what="nothing left after a clean stop", interval_s=0.1,
                 on_timeout=lambda: str([(p.pid, p.cmdline()) for p in _marked(mark)]))
    finally:
        _cleanup(mark)
