"""Is the engine kept full? Sampled on the engine's event loop, logged, exported.

The whole system reached 1.012 of bare vLLM on an H200 with 300-token answers but 0.946
with 100-token ones (docs/performance.md), where ~160 conversations end, and new ones
must be admitted, every second. Two things can starve the engine there, and they call
for different fixes: the worker holds too little work (the gate has nobody waiting:
hold more batches), or it holds enough but its event loop is too slow to hand it over
(conversations wait at the gate while the engine has room: less Python per
conversation on the loop). This tells them apart, every ``REPORT_S`` seconds:

    engine occupancy (60 s): 15,620 output tok/s, 1,530 requests on average, max_num_seqs 1,024;
    below it 0.2% of the time with conversations waiting at the gate, 0.0% with none; loop lag mean
    0.4 ms, max 12 ms [samples 600 short_waiting 1 short_idle 0 requests 1530.2 lag_ms 0.4
    lag_max_ms 12.0 tokens 937200 at 1764604214.7 over 60.00]

The bracket is for scripts (bench/throughput.py and bench/gpu/throughput.py add the
windows of a run up, and read the output tokens of the generations that ended in each
window, ``at`` its end, ``over`` its length in seconds, for a run's steady-state rate).
"Requests" are what the engine holds, running or queued in it; below max_num_seqs it
cannot be running a full batch. The lag is how late the sampler's own sleep wakes: the
time every other callback on the loop (vLLM's output handler, rendering, parsing,
admission) keeps it busy. A sample costs one ``len()``; ten a second. Each window's
line is followed by the process's CPU by thread over it (worker/measure/thread_cpu.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from worker.measure import thread_cpu

log = logging.getLogger(__name__)

INTERVAL_S = 0.1
#: Seconds between log lines; ``REGEN_OCCUPANCY_REPORT_S`` overrides (benchmarks use 5).
REPORT_S = float(os.environ.get("REGEN_OCCUPANCY_REPORT_S", "60"))


@dataclass
class Window:
    """Samples of one reporting period (or, added up, of a whole run)."""

    samples: int = 0
    #: The engine held fewer than max_num_seqs requests while the gate had conversations waiting.
    short_waiting: int = 0
    #: ... and nobody was waiting: the worker had no more work in hand.
    short_idle: int = 0
    requests_sum: int = 0
    lag_sum_s: float = 0.0
    lag_max_s: float = 0.0
    #: Output tokens of the generations that ended in the window.
    tokens: int = 0
    #: When the window ended (epoch seconds; 0 for a sum of windows).
    at: float = 0.0
    #: How long it was (seconds; summed for a sum of windows).
    seconds: float = 0.0

    def add(self, *, requests: int, waiting: int, max_num_seqs: int, lag_s: float) -> None:
        self.samples += 1
        self.requests_sum += requests
        if requests < max_num_seqs:
            if waiting > 0:
                self.short_waiting += 1
            else:
                self.short_idle += 1
        self.lag_sum_s += lag_s
        self.lag_max_s = max(self.lag_max_s, lag_s)

    def merge(self, other: Window) -> Window:
        return Window(self.samples + other.samples, self.short_waiting + other.short_waiting,
                      self.short_idle + other.short_idle, self.requests_sum + other.requests_sum,
                      self.lag_sum_s + other.lag_sum_s, max(self.lag_max_s, other.lag_max_s),
                      self.tokens + other.tokens, 0.0, self.seconds + other.seconds)

    @property
    def busy(self) -> bool:
        """Anything happened: an idle worker logs nothing."""
        return self.requests_sum > 0 or self.short_waiting > 0 or self.tokens > 0

    def share(self, n: int) -> float:
        return n / self.samples if self.samples else 0.0

    @property
    def requests_mean(self) -> float:
        return self.requests_sum / self.samples if self.samples else 0.0

    @property
    def lag_mean_s(self) -> float:
        return self.lag_sum_s / self.samples if self.samples else 0.0

    def line(self, seconds: float, max_num_seqs: int) -> str:
        return (f"engine occupancy ({seconds:.0f} s): {self.tokens / max(seconds, 1e-9):,.0f} output tok/s, "
                f"{self.requests_mean:,.0f} requests on average, "
                f"max_num_seqs {max_num_seqs:,}; below it {self.share(self.short_waiting):.1%} of the time with "
                f"conversations waiting at the gate, {self.share(self.short_idle):.1%} with none; loop lag mean "
                f"{self.lag_mean_s * 1e3:.1f} ms, max {self.lag_max_s * 1e3:.0f} ms "
                f"[samples {self.samples} short_waiting {self.short_waiting} short_idle {self.short_idle} "
                f"requests {self.requests_mean:.1f} lag_ms {self.lag_mean_s * 1e3:.2f} "
                f"lag_max_ms {self.lag_max_s * 1e3:.1f} tokens {self.tokens} at {self.at:.1f} "
                f"over {seconds:.2f}]")


_BRACKET = re.compile(r"\[samples (\d+) short_waiting (\d+) short_idle (\d+) requests ([\d.]+) "
                      r"lag_ms ([\d.]+) lag_max_ms ([\d.]+)(?: tokens (\d+) at ([\d.]+)(?: over ([\d.]+))?)?\]")


def logged_windows(lines: Iterable[str]) -> list[Window]:
    """Each window logged in ``lines`` (a worker log), in order."""
    windows = []
    for line in lines:
        m = _BRACKET.search(line)
        if m:
            n, sw, si = int(m[1]), int(m[2]), int(m[3])
            windows.append(Window(n, sw, si, round(float(m[4]) * n), float(m[5]) / 1e3 * n, float(m[6]) / 1e3,
                                  int(m[7] or 0), float(m[8] or 0.0), float(m[9] or 0.0)))
    return windows


def parse_windows(lines: Iterable[str]) -> Window:
    """The windows logged in ``lines`` (a worker log), added up."""
    total = Window()
    for window in logged_windows(lines):
        total = total.merge(window)
    return total


class OccupancySampler:
    """Samples the engine's request count, the gate's queue and the loop's lag; logs a window per period."""

    def __init__(self, requests: Callable[[], int], anyone_waiting: Callable[[], bool], max_num_seqs: int, *,
                 interval_s: float = INTERVAL_S, report_s: float = REPORT_S):
        self._requests, self._anyone_waiting = requests, anyone_waiting
        self.max_num_seqs = max_num_seqs
        self.interval_s, self.report_s = interval_s, report_s
        self.window = Window()
        #: Everything since the engine started (the Prometheus figures).
        self.total = Window()
        #: Since the last ``take`` (worker/batches/holding.py reads it every few seconds).
        self._unread = Window()
        #: Logged beside each window: which thread was busy when the engine ran short with work waiting.
        self._cpu = thread_cpu.ThreadCpu()

    def sample(self, lag_s: float) -> None:
        kwargs = {"requests": self._requests(), "waiting": int(bool(self._anyone_waiting())), "max_num_seqs": self.max_num_seqs,
                  "lag_s": max(0.0, lag_s)}
        self.window.add(**kwargs)
        self.total.add(**kwargs)
        self._unread.add(**kwargs)

    def ended(self, tokens: int) -> None:
        """A generation ended with ``tokens`` output tokens (called on the loop, by EngineHost.generate)."""
        self.window.tokens += tokens
        self.total.tokens += tokens

    def take(self) -> Window:
        """The samples since the last call (from another thread: a sample may land in either window)."""
        taken, self._unread = self._unread, Window()
        return taken

    def figures(self) -> dict[str, float]:
        """Since the engine started, for Prometheus (worker/process/consumer.py)."""
        return {"short_with_work_seconds": self.total.short_waiting * self.interval_s,
                "short_without_work_seconds": self.total.short_idle * self.interval_s,
                "loop_lag_max_seconds": self.total.lag_max_s}

    def report(self, seconds: float) -> None:
        cpu = self._cpu.take()
        self.window.at, self.window.seconds = time.time(), seconds
        if self.window.busy:
            log.info("%s", self.window.line(seconds, self.max_num_seqs))
            log.info("%s", thread_cpu.line(seconds, cpu))
        self.window = Window()

    async def run(self) -> None:
        """Forever, on the engine loop (cancelled at shutdown)."""
        started = time.monotonic()
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            self.sample(now - before - self.interval_s)
            if now - started >= self.report_s:
                self.report(now - started)
                started = now
