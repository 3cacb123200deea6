"""kill -9 of the `regen worker` launcher leaves nothing behind, at any moment of its worker's life:
before the engine exists, while it loads, while it serves batches (which go back), and while it shuts
down after a SIGTERM (issue 12, issue 27: no orphan holding a GPU).

A worker's processes are found by the environment mark the fixture gives each worker and every process
it starts inherits (tests/fixtures/worker.py), never by name: other sessions run engines here too.
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.faults.farm import running_on, write_prompts
from tests.fixtures.worker import READY_TIMEOUT_S
from tests.support.helpers import cli_env, run_cli, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]

#: The bound the issue sets for every regen and vLLM process of the node to be gone.
GONE_WITHIN_S = 20.0


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            pass
    return out


def _is_engine(p: psutil.Process) -> bool:
    try:
        return "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()
    except psutil.NoSuchProcess:
        return False


def _is_worker_process(p: psutil.Process, w) -> bool:
    """The launcher's child that is not its reaper (Celery retitles it, so its command line says little).

    Only a child that has exec'd counts: between fork and exec a child still shows the launcher's
    own command line and may yet become the reaper (a kill timed on it once landed too early).
    """
    try:
        cmdline = p.cmdline()
        return (p.ppid() == w.proc.pid and "worker.process.reaper" not in cmdline
                and cmdline != psutil.Process(w.proc.pid).cmdline())
    except psutil.NoSuchProcess:
        return False


#: The worker process's line when its warm shutdown begins (worker/process/consumer.py).
SHUTTING_DOWN = "shutting down, handing back its"
#: vLLM's engine core's line as it starts loading the model (its CPU model runner), before any weight is read.
LOADING = "Starting to load model"


def _kill_launcher_and_wait_gone(w) -> float:
    """SIGKILL the launcher alone, as an OOM killer or `kill -9` would; seconds until nothing of it is left."""
    assert w.proc.poll() is None, f"the launcher had exited before its kill:\n{w.log()[-3000:]}"
    w.proc.send_signal(signal.SIGKILL)
    w.proc.wait(timeout=10)
    killed_at = time.monotonic()
    wait_for(lambda: not w.processes(), timeout_s=GONE_WITHIN_S + 10, what="every worker and engine process gone",
             interval_s=0.25, on_timeout=lambda: "\n".join(_describe(w.processes())) + "\n" + w.log()[-3000:])
    gone_s = time.monotonic() - killed_at
    assert gone_s < GONE_WITHIN_S, f"processes outlived their launcher by {gone_s:.0f} s:\n{w.log()[-3000:]}"
    print(f"every process gone {gone_s:.1f} s after the launcher's SIGKILL")  # shown with -s or -rP
    return gone_s


# Each moment asserts its premise just before the kill: what it means to interrupt has started
# and has not yet finished. A kill that came too early (nothing started, nothing to leave behind)
# or too late would pass without testing the moment it names.


def _before_the_worker_runs(w) -> None:
    # The launcher has forked its first child (its reaper or its worker): from here on something can be left behind.
    wait_for(lambda: any(p.pid != w.proc.pid for p in w.processes()), timeout_s=60,
             what="the launcher's first child", interval_s=0.02, on_timeout=lambda: w.log()[-3000:])
    procs = w.processes()
    assert any(p.pid != w.proc.pid for p in procs), "too early: the launcher has started nothing"
    assert not any(_is_engine(p) for p in procs) and SHUTTING_DOWN not in w.log() and " ready." not in w.log(), \
        "too late: the worker already runs"


def _before_the_engine_exists(w) -> None:
    wait_for(lambda: any(_is_worker_process(p, w) for p in w.processes()), timeout_s=60, what="the worker process",
             interval_s=0.1)
    procs = w.processes()
    assert any(_is_worker_process(p, w) for p in procs), "too early: the worker process is gone"
    assert not any(_is_engine(p) for p in procs), "too late: the engine process already exists"


def _while_the_engine_loads(w) -> None:
    # Inside the model load (~20 s alone on this CPU), where vLLM's engine core ignores SIGTERM.
    wait_for(lambda: any(_is_engine(p) for p in w.processes()) and LOADING in w.log(), timeout_s=READY_TIMEOUT_S,
             what="the engine process loading the model", interval_s=0.1, on_timeout=lambda: w.log()[-3000:])
    assert any(_is_engine(p) for p in w.processes()), "the engine process is gone"
    assert "engine ready" not in w.log(), "too late: the engine finished loading"


def _while_it_shuts_down(w) -> None:
    w.wait_ready()
    w.proc.send_signal(signal.SIGTERM)
    # The worker process itself has begun its warm shutdown (not only the launcher its stop).
    wait_for(lambda: SHUTTING_DOWN in w.log(), timeout_s=10, what="the worker shutting down", interval_s=0.05,
             on_timeout=lambda: w.log()[-3000:])
    procs = w.processes()
    assert any(_is_worker_process(p, w) for p in procs), "too late: the worker process already exited"
    assert any(_is_engine(p) for p in procs), "too late: the engine already stopped"


@pytest.mark.parametrize("moment", [_before_the_worker_runs, _before_the_engine_exists, _while_the_engine_loads,
                                    _while_it_shuts_down], ids=lambda f: f.__name__.strip("_"))
def test_a_launcher_killed_at_any_moment_leaves_no_process(moment, start_worker):
    # Compiled where the kill must land inside the model load: eager, it is over in a second or two.
    w = start_worker("o", concurrency=1, compiled=moment is _while_the_engine_loads)
    moment(w)
    _kill_launcher_and_wait_gone(w)


def test_a_killed_launcher_takes_its_workers_and_engines_with_it(settings, s3_env, s3_bucket, sessions,
                                                                 start_worker, tmp_path):
    env = cli_env(settings, s3_env)
    write_prompts(tmp_path / "orphans.jsonl", 32, prefix="o")
    w = start_worker("o", concurrency=0)
    w.wait_ready()
    run_cli(["submit", str(tmp_path / "orphans.jsonl"), "--run", "orphans", "--model", w.model, "--output",
             f"{s3_bucket}/orphans", "--batch-size", "4", "--max-tokens", "512", "--seed", "1",
             "--quality-thresholds", '{"gate_overridden": true}'], env)
    wait_for(lambda: running_on(sessions, "orphans", "o") >= 1, timeout_s=180, what="batches running",
             interval_s=0.2, on_timeout=lambda: w.log()[-3000:])
    procs = w.processes()
    assert any(_is_engine(p) for p in procs) and any(_is_worker_process(p, w) for p in procs), _describe(procs)

    _kill_launcher_and_wait_gone(w)
    # It stopped the way a preempted worker does: its batches went back, none left 'running'.
    assert running_on(sessions, "orphans", "o") == 0
