"""How many batches a worker process holds: grown whenever the engine runs short of work.

A batch is held until its longest conversation ends, so how many batches keep an
engine full depends on how long the tail of the answers is against their mean,
which nobody knows before the run. worker/engine/admission.py's ``batches_to_hold`` is a
start sized for thinking-trace tails (the longest of 64 at ~5.3x the mean). Answers
capped at 14x their mean, the shape of bench/throughput.py's 100-token workload, need
about twice that: with the derived 6 batches (max_num_seqs 32, the CPU) the engine
held fewer requests than max_num_seqs a fifth of the time while the gate had nobody
waiting, and the whole system ran at 0.86 of bare vLLM; 12 batches gave 0.96
(docs/performance.md). So the worker measures instead of guessing: every
``ADAPT_S`` seconds it reads the engine-occupancy window (worker/engine/occupancy.py), and
when the engine was short of requests with nothing waiting at the gate while the
process held all the batches it may, it may hold a quarter more, up to ``CEILING``
times the start.

The limit is Celery's prefetch count (kombu's Redis transport delivers at most that
many unacknowledged messages; a batch's message is acknowledged only at its commit),
over a thread pool sized to the ceiling (threads start on first use). It only grows:
a worker restart starts again from the derivation. A user's ``--concurrency`` is
taken as it is, fixed. Each change is logged.

**Bounded by the backlog** (issue 22). Holding more keeps an engine full, but every batch a
worker holds is a batch no other worker can run: an H200's 122 batches (up to 488 grown)
are ~20 min of work, and at 64 GPUs over half of a 914K run is held at once. When the
queue runs dry, whatever a worker holds beyond what the others hold is a tail on it
while they idle. So, once per heartbeat period (worker/batches/backlog.py: one counter read of
the ledger, one Redis script call), the worker learns the open batches of the active runs
on its queues, whether any wait on the queue or are still planned, and the GPUs of the
live workers sharing them, and:

* its **fair share** is ``ceil(open x its GPUs / live GPUs)``: what is left, running
  batches included, split by engine. ``SHARE_SLACK`` above it (at least one batch) is
  tolerated, so two workers do not pass a batch to and fro over a rounding;
* **while the queue has work** its limit is ``min(grown, max(share + slack, floor))``:
  near the end it takes no more than its share of the last batches, but never fewer than
  ``floor``, the batches that fill its own admission gate (its level in batches, plus
  two: one committing, one being claimed), while there is work to take;
* **when the queue is empty and other workers share the run**, its limit is
  ``min(grown, share + slack)`` and it **hands back** the batches it holds beyond that
  which have not started (no conversation admitted: worker/engine/admission.py
  ``withdraw_unstarted``, newest first, the ones it would have run last). Each goes back
  through the existing release path: ledger ``queued`` with no failure counted, the
  message rejected with requeue (back on the queue), the fence untouched. A started batch
  is never handed back: its work would be lost. Before handing back, the worker waits
  until its consumer has applied the lowered prefetch and its blocking read in flight
  has timed out (``BRPOP_S``), so the message goes to a worker with room, not back to it.

Why the share counts running batches: a worker cannot see what the others hold, only
the run's open counter; since the shares sum to what is open, a worker above its share
means another is below it, i.e. will idle first. Why a floor only while the queue has
work: then holding fewer than fill the gate would starve the engine for nothing; once the
queue is empty there is nothing to take but what others hand back. A user's fixed
``--concurrency`` is not bounded either (no controller runs). What it cannot fix: a batch
already started stays where it is, so a run's very end is still its longest
conversations, on whichever engines hold them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import bootsteps

from worker.batches.backlog import Backlog
from worker.engine.occupancy import INTERVAL_S, Window

log = logging.getLogger(__name__)

ADAPT_S = 2.0
#: Share of a window the engine may run short with no work waiting before the worker holds more.
GROW_AT = 0.02
GROWTH = 0.25
#: The most a worker grows to, in multiples of its start.
CEILING = 4
#: Batches above its fair share a worker keeps before handing any back, as a share of the
#: share (at least 1): a rounding must not send batches to and fro between two workers.
SHARE_SLACK = 0.125
#: kombu's Redis BRPOP timeout (``brpop_timeout``, 1 s) plus a margin: a blocking read in
#: flight when the prefetch was lowered ends within this, and is not issued again.
BRPOP_S = 1.3
#: The longest wait for the consumer to apply a lowered prefetch before handing back anyway.
APPLY_WAIT_S = 3.0


def stale_after_s(period_s: float) -> float:
    """When a worker's registration (worker/batches/backlog.py) is stale: three missed probes.

    A probe runs at a controller step (every ``ADAPT_S``) once ``period_s`` has passed, and a
    hand-back delays the next step by up to ``APPLY_WAIT_S + BRPOP_S``: a live worker is never
    dropped for one slow step, and a dead one stops counting within ~20 s at the 5 s heartbeat.
    """
    return 3 * max(period_s, ADAPT_S) + APPLY_WAIT_S + BRPOP_S


def fair_share(backlog: Backlog, gpus: int) -> int:
    """This worker's part of the open batches (running ones included), by its GPUs against the live ones."""
    return math.ceil(backlog.open_batches * gpus / max(gpus, backlog.live_gpus))


def share_bound(backlog: Backlog, gpus: int) -> int:
    """The fair share plus ``SHARE_SLACK`` (at least one batch): the most this worker holds near the end."""
    share = fair_share(backlog, gpus)
    return share + max(1, math.ceil(share * SHARE_SLACK))


def bounded_limit(grown: int, *, floor: int, backlog: Backlog | None, gpus: int) -> int:
    """The batches to hold: ``grown`` capped near the fair share, not below ``floor`` while the queue has work."""
    if backlog is None or backlog.open_batches == 0:
        # Nothing open to share: a run submitted now is taken at full speed, not one batch per worker.
        return grown
    bound = share_bound(backlog, gpus)
    if backlog.queue_has_work:
        bound = max(bound, floor)
    return max(1, min(grown, bound))


def to_hand_back(held: int, *, backlog: Backlog | None, gpus: int) -> int:
    """Batches to hand back: those held beyond the share bound once the queue is empty and others share the run."""
    if backlog is None or backlog.queue_has_work or backlog.live_gpus <= gpus:
        return 0
    return max(0, held - share_bound(backlog, gpus))


@dataclass
class Sharing:
    """What the controller needs to bound its holding by the backlog (worker/batches/backlog.py, worker/process/runtime.py)."""

    #: Reads the backlog (the ledger's counter and Redis): once per ``period_s``.
    probe: Callable[[], Backlog]
    #: Batches this process holds now (claimed, not yet committed or handed back).
    held: Callable[[], int]
    #: Batches that fill this worker's admission gate (its level in batches, plus two).
    floor: Callable[[], int]
    #: Withdraws up to n held batches that have not started; how many it withdrew.
    hand_back: Callable[[int], int]
    #: GPUs this process stands for (``--fake-engine gpus=N``; 1 otherwise).
    gpus: int = 1
    period_s: float = 5.0
    #: Deregisters this worker at its stop.
    leave: Callable[[], None] = lambda: None


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
    """Applies a ``HoldingPolicy`` (and, given ``sharing``, the backlog bound) to a Celery consumer's prefetch."""

    def __init__(self, policy: HoldingPolicy, *, window: Callable[[], Window | None],
                 held_peak: Callable[[], int], stop: threading.Event, interval_s: float = ADAPT_S,
                 sharing: Sharing | None = None):
        self.policy = policy
        #: What the engine's starvation grew the holding to; ``limit`` is that, bounded by the backlog.
        self.grown = policy.start
        self.limit = policy.start
        self.backlog: Backlog | None = None
        self._window, self._held_peak, self._stop = window, held_peak, stop
        self.interval_s = interval_s
        self.sharing = sharing
        self._probed_at = -math.inf
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
        # Grown only while not bounded by the backlog: a capped worker holds less on purpose.
        if window is not None and self.limit == self.grown:
            new = self.policy.next_limit(self.grown, window, self._held_peak())
            if new != self.grown:
                log.info("holding up to %d batches (was %d): the engine was below max_num_seqs %.0f%% of the last "
                         "%.0f s with no conversation waiting at the gate", new, self.grown,
                         window.share(window.short_idle) * 100, window.samples * INTERVAL_S)
                self.grown = new
        fresh = self._probe()
        sharing = self.sharing
        gpus = sharing.gpus if sharing else 1
        floor = sharing.floor() if sharing else 1
        new = bounded_limit(self.grown, floor=floor, backlog=self.backlog, gpus=gpus)
        if new != self.limit:
            b = self.backlog
            if b is not None and new < self.grown:
                log.info("holding at most %d batches (was %d, grown %d): %d open for %d live GPUs (this worker %d), "
                         "%d waiting%s", new, self.limit, self.grown, b.open_batches, b.live_gpus, gpus, b.waiting,
                         ", more planned" if b.planned else "")
            else:
                log.info("holding up to %d batches again (was %d)", new, self.limit)
            self._apply(new)
        if fresh and sharing is not None:
            excess = to_hand_back(sharing.held(), backlog=self.backlog, gpus=gpus)
            if excess:
                self._hand_back(excess)
        return self.limit

    def _probe(self) -> bool:
        """Read the backlog once per ``sharing.period_s``; True if read now. A failed read drops the bound."""
        if self.sharing is None or time.monotonic() - self._probed_at < self.sharing.period_s:
            return False
        self._probed_at = time.monotonic()
        try:
            self.backlog = self.sharing.probe()
        except Exception as e:  # noqa: BLE001 - unbounded (as before this bound) until the next read works
            if self.backlog is not None:
                log.warning("reading the backlog failed (%s: %s); holding unbounded by it until it works",
                            type(e).__name__, e)
            self.backlog = None
            return False
        return True

    def _apply(self, new: int) -> None:
        with self._lock:
            old, self.limit = self.limit, new
            if self._qos is not None:
                # Celery's consumer loop applies the new value (QoS.update) on its own thread.
                if new > old:
                    self._qos.increment_eventually(new - old)
                else:
                    self._qos.decrement_eventually(old - new)

    def _hand_back(self, n: int) -> None:
        assert self.sharing is not None and self.backlog is not None
        self._await_prefetch_applied()
        held = self.sharing.held()
        handed = self.sharing.hand_back(n)
        b = self.backlog
        (log.info if handed else log.debug)("handing back %d held batches not started (%d held beyond the bound): the queue is empty and this "
                 "worker held %d, above its share %d of %d open batches for %d live GPUs", handed, n, held,
                 fair_share(b, self.sharing.gpus), b.open_batches, b.live_gpus)

    def _await_prefetch_applied(self) -> None:
        """Until the consumer runs with our lowered prefetch and its blocking read in flight has ended."""
        qos = self._qos
        deadline = time.monotonic() + APPLY_WAIT_S
        while qos is not None and getattr(qos, "prev", qos.value) != qos.value and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.wait(BRPOP_S)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.step()
                except Exception:  # noqa: BLE001 - never let sizing kill the worker; the limit stays
                    log.exception("adjusting the held batches failed")
            if self.sharing is not None:
                try:
                    self.sharing.leave()
                except Exception as e:  # noqa: BLE001 - the entry goes stale in seconds anyway
                    log.warning("leaving the holders' registry failed: %s: %s", type(e).__name__, e)

        threading.Thread(target=loop, name="holding", daemon=True).start()


def consumer_step(controller: HoldingController) -> type[bootsteps.StartStopStep]:
    """A consumer bootstep that hands each (re)started consumer's QoS to ``controller``."""

    class HeldBatches(bootsteps.StartStopStep):
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, c: Any) -> None:
            controller.attach(c.qos)

    return HeldBatches
