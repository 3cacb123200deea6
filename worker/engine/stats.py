"""vLLM's scheduler as the engine saw it: running, waiting, preemptions, KV-cache usage, prefix-cache hits.

For a diagnosis only (issue 21: where does the whole system lose its time against bare
vLLM when the KV cache, not max_num_seqs, limits the engine?). Off by default: with
stats on, vLLM's engine core builds a ``SchedulerStats`` every step and its frontend
an ``IterationStats`` per output, which regen's engines do not pay for
(``disable_log_stats``, worker/engine/host.py). ``REGEN_ENGINE_STATS=1`` in the environment
turns them on, in the worker (``AsyncLLM``) and in the benchmarks' bare ``LLM`` alike,
and hangs this recorder beside vLLM's own loggers, so both phases of a benchmark are
read by the same code. vLLM's own ``LoggingStatLogger`` then also logs its line every
few seconds.

The worker logs one line per occupancy window (worker/engine/occupancy.py's period):

    engine scheduler (5 s): 84 steps; running mean 310, max 320; waiting mean 1,190, max 1,230;
    12 preemptions; KV cache 97.8% used on average, full (>= 95%) in 91% of the steps;
    prefix cache 2.1% of queried tokens hit; 55 requests admitted to the engine
    [steps 84 running 26040 running_max 320 waiting 99960 waiting_max 1230 preempted 12
    kv 82.15 kv_full 76 pc_queries 81234 pc_hits 1706 admitted 55 at 1764604214.7 over 5.00]

The bracket is for bench/throughput.py and bench/gpu/throughput.py, which add a run's
windows up. How the recorder is attached: vLLM 0.26-0.33 keep a ``logger_manager``
(``StatLoggerManager``) on ``LLMEngine`` and ``AsyncLLM`` whose loggers get every
step's ``record(scheduler_stats, iteration_stats, ...)``; the recorder is appended to
its loggers (``stat_loggers``; older releases: ``per_engine_logger_dict``). Any other
shape is reported, not guessed at.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

log = logging.getLogger(__name__)

STATS_ENV = "REGEN_ENGINE_STATS"
#: KV-cache usage at or above this counts as a full cache: new prefills wait or preempt.
FULL_KV = 0.95


def stats_wanted() -> bool:
    """Whether this process should record vLLM's scheduler stats (``REGEN_ENGINE_STATS=1``)."""
    return os.environ.get(STATS_ENV, "").strip() not in ("", "0", "false", "no")


@dataclass
class SchedulerWindow:
    """Engine steps of one period (or, added up, of a whole run)."""

    steps: int = 0
    running: int = 0
    running_max: int = 0
    waiting: int = 0
    waiting_max: int = 0
    preempted: int = 0
    kv: float = 0.0
    kv_full: int = 0
    pc_queries: int = 0
    pc_hits: int = 0
    #: Requests handed to the engine in the period (the worker's admission gate; 0 for bare LLM.generate,
    #: which adds all of them before its first step).
    admitted: int = 0
    at: float = 0.0
    over: float = 0.0

    def step(self, *, running: int, waiting: int, kv_usage: float, preempted: int, pc_queries: int,
             pc_hits: int) -> None:
        self.steps += 1
        self.running += running
        self.running_max = max(self.running_max, running)
        self.waiting += waiting
        self.waiting_max = max(self.waiting_max, waiting)
        self.kv += kv_usage
        self.kv_full += kv_usage >= FULL_KV
        self.preempted += preempted
        self.pc_queries += pc_queries
        self.pc_hits += pc_hits

    def merge(self, other: SchedulerWindow) -> SchedulerWindow:
        return SchedulerWindow(
            self.steps + other.steps, self.running + other.running, max(self.running_max, other.running_max),
            self.waiting + other.waiting, max(self.waiting_max, other.waiting_max), self.preempted + other.preempted,
            self.kv + other.kv, self.kv_full + other.kv_full, self.pc_queries + other.pc_queries,
            self.pc_hits + other.pc_hits, self.admitted + other.admitted, max(self.at, other.at),
            self.over + other.over)

    def _mean(self, total: float) -> float:
        return total / self.steps if self.steps else 0.0

    def describe(self) -> str:
        if not self.steps:
            return "no engine step recorded"
        hit = f"{self.pc_hits / self.pc_queries:.1%}" if self.pc_queries else "-"
        text = (f"{self.steps:,} steps; running mean {self._mean(self.running):,.0f}, max {self.running_max:,}; "
                f"waiting mean {self._mean(self.waiting):,.0f}, max {self.waiting_max:,}; "
                f"{self.preempted:,} preemptions; KV cache {self._mean(self.kv):.1%} used on average, full "
                f"(>= {FULL_KV:.0%}) in {self._mean(self.kv_full):.0%} of the steps; prefix cache {hit} of "
                f"queried tokens hit")
        if self.admitted:
            text += f"; {self.admitted:,} requests admitted to the engine"
        return text

    def line(self) -> str:
        bracket = " ".join(f"{f.name} {getattr(self, f.name):.{_PLACES.get(f.name, 0)}f}" for f in fields(self))
        return f"engine scheduler ({self.over:.0f} s): {self.describe()} [{bracket}]"


_PLACES = {"kv": 2, "at": 1, "over": 2}
_BRACKET = re.compile(r"\[steps (\d+) running (\d+) running_max (\d+) waiting (\d+) waiting_max (\d+) "
                      r"preempted (\d+) kv ([\d.]+) kv_full (\d+) pc_queries (\d+) pc_hits (\d+) "
                      r"admitted (\d+) at ([\d.]+) over ([\d.]+)\]")


def logged_scheduler_windows(lines: Iterable[str]) -> list[SchedulerWindow]:
    """Each ``engine scheduler`` window logged in ``lines`` (a worker log), in order."""
    out = []
    for text in lines:
        m = _BRACKET.search(text)
        if m:
            ints = [int(x) for x in m.groups()[:6]]
            out.append(SchedulerWindow(*ints, float(m[7]), int(m[8]), int(m[9]), int(m[10]), int(m[11]),
                                       float(m[12]), float(m[13])))
    return out


def added_up(windows: Iterable[SchedulerWindow]) -> SchedulerWindow:
    total = SchedulerWindow()
    for w in windows:
        total = total.merge(w)
    return total


class SchedulerRecorder:
    """A stat logger for vLLM's ``StatLoggerManager``: adds every step's scheduler stats up.

    The worker calls ``flush`` once a period (``run``, on the engine loop, where vLLM's
    output handler calls ``record``: no locks), which logs the window's line; the
    benchmark's bare engine reads ``total()`` after each run. ``admitted``: the count of
    requests handed to the engine so far (the worker's gate).
    """

    def __init__(self, *, admitted: Callable[[], int] | None = None):
        self._admitted = admitted
        self.reset()

    def reset(self) -> None:
        self._total = SchedulerWindow()
        self._window = SchedulerWindow()
        self._since = time.monotonic()
        self._admitted_at_start = self._admitted() if self._admitted else 0

    def total(self) -> SchedulerWindow:
        return self._total.merge(self._window)

    # --- vLLM's stat-logger interface (the parts it calls; the rest are no-ops below)
    def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
        if scheduler_stats is None:
            return
        prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
        self._window.step(
            running=int(getattr(scheduler_stats, "num_running_reqs", 0)),
            waiting=int(getattr(scheduler_stats, "num_waiting_reqs", 0))
            + int(getattr(scheduler_stats, "num_skipped_waiting_reqs", 0) or 0),
            kv_usage=float(getattr(scheduler_stats, "kv_cache_usage", 0.0) or 0.0),
            preempted=int(getattr(iteration_stats, "num_preempted_reqs", 0) or 0) if iteration_stats else 0,
            pc_queries=int(getattr(prefix, "queries", 0) or 0), pc_hits=int(getattr(prefix, "hits", 0) or 0))

    def flush(self) -> None:
        now = time.monotonic()
        window, self._window = self._window, SchedulerWindow()
        if self._admitted is not None:
            admitted = self._admitted()
            window.admitted, self._admitted_at_start = admitted - self._admitted_at_start, admitted
        window.at, window.over = time.time(), now - self._since
        self._since = now
        self._total = self._total.merge(window)
        if window.steps or window.admitted:
            log.info("%s", window.line())

    async def run(self, report_s: float) -> None:
        """Forever, on the engine loop: a window line every ``report_s`` (cancelled at shutdown)."""
        import asyncio

        while True:
            await asyncio.sleep(report_s)
            self.flush()

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:
        # Hooks a newer vLLM calls on every logger (record_sleep_state, record_admission_rejection, ...).
        if name.startswith("record_") or name.startswith("log_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def attach(engine: Any, recorder: SchedulerRecorder) -> SchedulerRecorder:
    """Hang ``recorder`` beside the stat loggers of an ``LLMEngine`` or ``AsyncLLM`` built with stats on."""
    manager = getattr(engine, "logger_manager", None)
    if manager is None:
        raise RuntimeError("this vLLM engine keeps no stat loggers: was it built with disable_log_stats=False?")
    loggers = getattr(manager, "stat_loggers", None)
    if isinstance(loggers, list):
        loggers.append(recorder)
        return recorder
    per_engine = getattr(manager, "per_engine_logger_dict", None)
    if isinstance(per_engine, dict) and per_engine:
        for engine_loggers in per_engine.values():
            engine_loggers.append(recorder)
        return recorder
    raise RuntimeError(f"unknown StatLoggerManager shape ({sorted(vars(manager))}): scheduler stats not recorded")


def attach_to_llm(llm: Any) -> SchedulerRecorder:
    """For the benchmarks' bare ``vllm.LLM``: totals only, read after each run."""
    return attach(llm.llm_engine, SchedulerRecorder())
