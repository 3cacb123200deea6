"""How many batches a worker process holds: grown whenever the engine runs short of work.

A batch is held until its longest conversation ends, so how many batches keep an
engine full depends on how long the tail of the answers is against their mean,
which nobody knows before the run. worker/admission.py's ``batches_to_hold`` is a
start sized for thinking-trace tails (the longest of 64 at ~5.3x the mean). Answers
capped at 14x their mean, the shape of bench/throughput.py's 100-token workload, need
about twice that: with the derived 6 batches (max_num_seqs 32, the CPU) the engine
held fewer requests than max_num_seqs a fifth of the time while the gate had nobody
waiting, and the whole system ran at 0.86 of bare vLLM; 12 batches gave 0.96
(docs/performance.md). So the worker measures instead of guessing: every
``ADAPT_S`` seconds it reads the engine-occupancy window (worker/occupancy.py), and
when the engine was short of requests with nothing waiting at the gate while the
process held all the batches it may, it may hold a quarter more, up to ``CEILING``
times the start.

The limit is Celery's prefetch count (kombu's Redis transport delivers at most that
many unacknowledged messages; a batch's message is acknowledged only at its commit),
over a thread pool sized to the ceiling (threads start on first use). It only grows:
a worker restart starts again from the derivation. A user's ``--concurrency`` is
taken as it is, fixed. Each change is logged.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import bootsteps

from .occupancy import INTERVAL_S, Window

log = logging.getLogger(__name__)

ADAPT_S = 2.0
#: Share of a window the engine may run short with no work waiting before the worker holds more.
GROW_AT = 0.02
GROWTH = 0.25
#: The most a worker grows to, in multiples of its start.
CEILING = 4


@dataclass
class HoldingPolicy:
    start: int
    ceiling: int

    @classmethod
    def derived(cls, start: int) -> HoldingPolicy:
        return cls(start=start, ceiling=max(start, start * CEILING))

    def next_limit(self, current: int, window: Window, held_peak: int) -> int:
        """The limit after ``window``: grown when the engine starved for want of held work."""
        starved = window.samples >= 10 and window.share(window.short_idle) > GROW_AT
        # Held fewer than allowed: the queue had nothing more to give (a run's end), holding more cannot help.
        at_limit = held_peak >= current
        if starved and at_limit and current < self.ceiling:
            return min(self.ceiling, current + max(1, math.ceil(current * GROWTH)))
        return current


class HoldingController:
    """Applies a ``HoldingPolicy`` to a Celery consumer's prefetch count, from a thread of its own."""

    def __init__(self, policy: HoldingPolicy, *, window: Callable[[], Window | None],
                 held_peak: Callable[[], int], stop: threading.Event, interval_s: float = ADAPT_S):
        self.policy = policy
        self.limit = policy.start
        self._window, self._held_peak, self._stop = window, held_peak, stop
        self.interval_s = interval_s
        self._qos: Any = None
        self._lock = threading.Lock()

    def attach(self, qos: Any) -> None:
        """Called at every consumer (re)start: Celery set the prefetch to the pool size; set ours."""
        with self._lock:
            self._qos = qos
            with qos._mutex:
                qos.value = self.limit
            qos.update()

    def step(self) -> int:
        window = self._window()
        if window is None:
            return self.limit
        new = self.policy.next_limit(self.limit, window, self._held_peak())
        if new != self.limit:
            log.info("holding up to %d batches (was %d): the engine was below max_num_seqs %.0f%% of the last "
                     "%.0f s with no conversation waiting at the gate", new, self.limit,
                     window.share(window.short_idle) * 100, window.samples * INTERVAL_S)
            with self._lock:
                old, self.limit = self.limit, new
                if self._qos is not None:
                    # Celery's consumer loop applies the new value (QoS.update) on its own thread.
                    self._qos.increment_eventually(new - old)
        return self.limit

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.step()
                except Exception:  # noqa: BLE001 - never let sizing kill the worker; the limit stays
                    log.exception("adjusting the held batches failed")

        threading.Thread(target=loop, name="holding", daemon=True).start()


def consumer_step(controller: HoldingController) -> type[bootsteps.StartStopStep]:
    """A consumer bootstep that hands each (re)started consumer's QoS to ``controller``."""

    class HeldBatches(bootsteps.StartStopStep):
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, c: Any) -> None:
            controller.attach(c.qos)

    return HeldBatches
