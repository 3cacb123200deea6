"""The estimate probe's progress: one stderr line at each phase and every PROGRESS_EVERY_S within one.

``regen estimate --sample 10`` used to print nothing for minutes (the engine's start, then the
probe's phases). The probe (worker/engine/pilot.py) runs in a subprocess; it writes these lines,
each starting with :data:`PREFIX`, and the estimate passes them on as they come
(producer/estimate/estimator.py), so the user sees which phase runs, how many samples are done,
and the time spent.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

#: What starts every progress line, so the estimate tells them from vLLM's own output.
PREFIX = "probe progress: "
#: Seconds between two lines within a phase: often enough to see it move, rarely enough to read.
PROGRESS_EVERY_S = 10.0


class ProbeProgress:
    """Writes the probe's phase, samples done and elapsed time, at most one line per ``every_s`` within a phase."""

    def __init__(self, samples: int, *, every_s: float = PROGRESS_EVERY_S, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.samples, self.every_s, self.out, self.clock = samples, every_s, out, clock
        self.started = clock()
        self.last = float("-inf")
        self.name = ""

    def _say(self, text: str) -> None:
        out = self.out or sys.stderr
        print(f"{PREFIX}{text}, {self.clock() - self.started:.0f} s", file=out, flush=True)
        self.last = self.clock()

    def phase(self, name: str, what: str) -> None:
        """A new phase starts: said at once."""
        self.name = name
        self._say(f"{name}: {what}")

    def tick(self, done: int, in_engine: int) -> None:
        """Within a phase: a line if ``every_s`` has passed since the last."""
        if self.clock() - self.last >= self.every_s:
            self._say(f"{self.name}: {done}/{self.samples} samples done, {in_engine} conversations in the engine")


def announce(text: str, out: TextIO | None = None) -> None:
    """One progress line outside the phases (the engine's start)."""
    print(f"{PREFIX}{text}", file=out or sys.stderr, flush=True)
