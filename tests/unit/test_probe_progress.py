"""The estimate's probe says its phase, samples done and time as it goes (issue 59), not only at the end."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from producer.estimate.probe_run import run_streaming
from worker.engine.probe_progress import PREFIX, ProbeProgress


def test_probe_progress_says_each_phase_at_once_and_within_one_every_interval():
    now = [100.0]
    out = io.StringIO()
    progress = ProbeProgress(24, every_s=10, out=out, clock=lambda: now[0])
    progress.phase("samples", "24 samples generating, 32 conversations at a time")
    for t, done in ((103, 2), (109, 5), (111, 9), (115, 12), (122, 20)):
        now[0] = t
        progress.tick(done, 32)
    now[0] = 130
    progress.phase("settled", "repeats keep the engine full")
    assert out.getvalue().splitlines() == [
        f"{PREFIX}samples: 24 samples generating, 32 conversations at a time, 0 s",
        f"{PREFIX}samples: 9/24 samples done, 32 conversations in the engine, 11 s",
        f"{PREFIX}samples: 20/24 samples done, 32 conversations in the engine, 22 s",
        f"{PREFIX}settled: repeats keep the engine full, 30 s"]


def test_the_probes_progress_lines_are_passed_on_as_they_come_and_the_rest_kept_for_a_failure(tmp_path):
    # The parent sees the first line while the child still runs: the child waits for a file the
    # parent writes once it has seen that line.
    go = tmp_path / "go"
    script = (f"import os, sys, time\nprint({PREFIX!r} + 'engine ready in 3 s', flush=True)\n"
              f"print('vLLM INFO chatter', flush=True)\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
              "print('ValueError: boom', file=sys.stderr, flush=True)\nsys.exit(3)\n")
    shown: list[str] = []

    def show(line: str) -> None:
        shown.append(line)
        go.touch()

    code, output = run_streaming([sys.executable, "-c", script], timeout_s=60, cwd=Path.cwd(), env=None, show=show)
    assert code == 3 and shown == ["engine ready in 3 s"]
    assert "vLLM INFO chatter" in output and "ValueError: boom" in output


def test_a_probe_past_its_time_is_killed_and_said_as_such(tmp_path):
    code, _ = run_streaming([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=0.5, cwd=Path.cwd(),
                            env=None, show=lambda line: None)
    assert code is None
