"""kill -9 of the `regen worker` launcher leaves nothing behind: its worker process hands its batches
back and exits, and vLLM's engine processes go with it (issue 12: no orphans holding a GPU)."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.faults.farm import running_on, write_prompts
from tests.support.helpers import cli_env, run_cli, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]

#: The bound the issue sets for every regen and vLLM process of the node to be gone.
GONE_WITHIN_S = 20.0


def _alive(pids: set[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} {' '.join(p.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            pass
    return out


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
    tree = {p.pid for p in w.tree()}
    assert len(tree) >= 3, f"expected launcher, worker and engine processes, found {tree}"

    w.proc.send_signal(signal.SIGKILL)  # the launcher alone, as an OOM killer or `kill -9` would
    w.proc.wait(timeout=10)
    killed_at = time.monotonic()
    wait_for(lambda: not _alive(tree - {w.proc.pid}), timeout_s=GONE_WITHIN_S + 10,
             what="every worker and engine process gone", interval_s=0.5,
             on_timeout=lambda: "\n".join(_alive(tree)) + "\n" + w.log()[-3000:])
    gone_s = time.monotonic() - killed_at
    assert gone_s < GONE_WITHIN_S, f"processes outlived their launcher by {gone_s:.0f} s"
    # It stopped the way a preempted worker does: its batches went back, none left 'running'.
    assert running_on(sessions, "orphans", "o") == 0
