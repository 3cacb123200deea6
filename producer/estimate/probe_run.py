"""Run the probe subprocess and pass its progress lines on as they come.

The probe (``python -m worker.engine.pilot``) takes minutes: the engine's start, then its phases.
Its output used to be captured whole and shown only on a failure, so the estimate was silent
until the end. Now each line it marks as progress (worker/engine/probe_progress.py) goes to
stderr at once (stdout stays the estimate's, ``--json`` included), and the rest is kept, its
tail only, for the failure message.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from worker.engine.probe_progress import PREFIX

#: Lines of the probe's output kept for a failure message (vLLM's tracebacks run to hundreds).
KEPT_LINES = 2000
#: Error lines kept from anywhere in the output besides its tail: a root cause logged early (a worker's
#: error, before thousands of lines of its aborted requests' tracebacks) is not lost with the head.
KEPT_CAUSES = 20
_CAUSE = re.compile(r"\b\w*(Error|Exception): ")


def say(text: str) -> None:
    """One progress line of the estimate itself, on stderr."""
    print(f"estimate: {text}", file=sys.stderr, flush=True)


def run_streaming(argv: list[str], *, timeout_s: float, cwd: Path, env: dict[str, str] | None,
                  show: Callable[[str], None] = say) -> tuple[int | None, str]:
    """Run ``argv``; ``show`` each progress line as it comes. Returns the exit code (None: timed out) and the output kept."""
    kept: deque[str] = deque(maxlen=KEPT_LINES)
    causes: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env,
                            errors="replace")

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            kept.append(line)
            if len(causes) < KEPT_CAUSES and _CAUSE.search(line):
                causes.append(line)
            if line.startswith(PREFIX):
                show(line[len(PREFIX):].rstrip())

    reader = threading.Thread(target=read, name="probe-output", daemon=True)
    reader.start()
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    reader.join(timeout=5.0)  # the output's last lines, after the exit
    return code, "".join(causes) + "".join(kept)
