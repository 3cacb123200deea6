"""Admission: the engine takes new conversations whenever it has room, not when a batch ends.

A worker process holds more batches than its engine runs at once: each Celery
thread claims a batch (leased, heartbeated, fenced like any other) and hands its
conversations to this gate, which lets at most ``level`` of them into the engine
at a time, oldest batch first. ``level`` sits above the engine's ``max_num_seqs``
(``ADMISSION_HEADROOM``), so vLLM always has waiting requests to start the moment
a running one finishes, while the rest of the held work waits here, not inside the
engine, where an abort or a shutdown would have to unwind it.

Why held batches: a batch is acknowledged only when its longest conversation has
ended, so with a long tail many batches are open at once, each waiting for one or
two stragglers. With 8 batches in flight (the old default) they started together
and finished together, and the engine drained once per round (0.84-0.93 of bare
vLLM, issue 15). Holding enough batches to cover the tails (``batches_to_hold``, the
start; worker/batches/holding.py grows it while the engine starves for want of work) keeps
work available; the gate decides what of it the engine sees.

Why a gate rather than everything into vLLM's queue: vLLM serves its waiting queue
first come, first served, so a multi-turn conversation's next turn would queue
behind thousands of fresh conversations and keep its batch (and thread) open for
the whole backlog; shutdown and fencing would abort thousands of requests instead
of a level's worth.

Oldest first (batch claim order, then position in the batch) finishes batches in
the order they were taken, so the worker commits steadily and its held work stays
bounded. A conversation keeps its slot across its turns: its next turn goes in
straight after a tool result is spliced, ahead of conversations not yet started.

A batch none of whose conversations was admitted yet ("held, not started") can be
withdrawn (``withdraw_unstarted``): its waiters fail with ``HandedBack`` and its task
hands it back to the ledger and the queue, for a worker with less to do near a run's
end (worker/batches/holding.py). Started batches are never withdrawn: their work would be lost.

Runs on the engine's event loop only (single-threaded asyncio: no locks).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math

from ledger.defaults import DEFAULT_BATCH_SIZE
from ledger.errors import RegenError

#: Conversations admitted above ``max_num_seqs``: the engine's own waiting queue,
#: refilled continuously, so vLLM's scheduler never finds it empty while a batch
#: commits. A choice, not tuned; what it ran at on an H200 is in docs/performance.md
#: (the GPU results in docs/results/).
ADMISSION_HEADROOM = 0.5

#: How many batches' worth of max_num_seqs a long tail keeps open. A batch is held
#: until its longest conversation ends: for lognormal lengths (sigma 1, thinking traces
#: look like this) the longest of 64 is ~5.3x the mean, so while it runs the engine
#: finishes ~5.3 x max_num_seqs other conversations from the batches behind it, and
#: all of those batches must already be held. 6 covers that with a margin.
TAIL_FACTOR = 6.0

#: The batch size a worker assumes before it has seen one (regen submit's default).
ASSUMED_BATCH_SIZE = DEFAULT_BATCH_SIZE


def admission_level(max_num_seqs: int) -> int:
    """Conversations in the engine at once: running plus a waiting queue for the next step."""
    return max(1, int(max_num_seqs * (1 + ADMISSION_HEADROOM)))


def batches_to_hold(max_num_seqs: int, batch_size: int = ASSUMED_BATCH_SIZE) -> int:
    """Batches a worker process holds at first so the gate is not short of work (worker/batches/holding.py grows it).

    The batches kept open by their tails (``TAIL_FACTOR`` x max_num_seqs conversations)
    plus the admission level, in batches, and two more so a batch that is uploading
    and committing leaves no gap. 256 sequences → 32 batches of 64; an H200's 1,024 →
    122. Threads are cheap and share a few ledger connections; the cost is at a run's
    end, where the last worker may still hold that much work (docs/performance.md).
    """
    conversations = TAIL_FACTOR * max_num_seqs + admission_level(max_num_seqs)
    return math.ceil(conversations / max(1, batch_size)) + 2


class HandedBack(RegenError):
    """The batch was withdrawn before any of its conversations started: give it back to the queue."""


class AdmissionGate:
    """At most ``level`` conversations in the engine; the rest wait, lowest ``order`` first.

    ``order[0]`` names the batch (worker/conversation/generation.py's ticket): what ``withdraw_unstarted``
    withdraws and ``forget`` clears.
    """

    def __init__(self, level: int):
        if level < 1:
            raise ValueError(f"admission level must be at least 1, got {level}")
        self.level = level
        self.admitted = 0
        #: Conversations let in since the gate was built (worker/engine/stats.py logs it per window).
        self.admitted_total = 0
        self._waiting: list[tuple[tuple, int, asyncio.Future]] = []
        self._tie = itertools.count()
        #: Batches (``order[0]``) with a conversation admitted, and batches withdrawn; cleared by ``forget``.
        self._started: set = set()
        self._withdrawn: set = set()

    @property
    def waiting(self) -> int:
        return sum(not f.done() for _, _, f in self._waiting)

    @property
    def has_waiting(self) -> bool:
        """Anyone waiting for a slot (cheap: stops at the first live waiter, usually the heap's top)."""
        return any(not f.done() for _, _, f in self._waiting)

    async def acquire(self, order: tuple) -> None:
        """Wait for a slot. Cancelling the waiter gives up its place (or its slot, if just granted).

        Raises ``HandedBack`` if the batch ``order[0]`` was withdrawn (before or while waiting).
        """
        if order[0] in self._withdrawn:
            raise HandedBack("withdrawn before it started")
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (order, next(self._tie), future))
        self._grant()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted and cancelled in the same step: the slot was ours
            else:
                future.cancel()
                self._grant()  # drop the cancelled waiter from the top of the heap
            raise

    def release(self) -> None:
        self.admitted -= 1
        self._grant()

    def set_level(self, level: int) -> None:
        """Change the level (worker/engine/kv_level.py). Lowered: nobody is evicted, fewer are let in as
        conversations end; raised: waiters are let in at once."""
        if level < 1:
            raise ValueError(f"admission level must be at least 1, got {level}")
        self.level = level
        self._grant()

    def unstarted(self) -> list:
        """Batches waiting here with no conversation admitted yet, newest (last in line) first."""
        keys = {order[0] for order, _, f in self._waiting if not f.done()}
        return sorted(keys - self._started - self._withdrawn, reverse=True)

    def withdraw_unstarted(self, n: int) -> list:
        """Withdraw up to ``n`` batches that have not started, newest first; their waiters raise ``HandedBack``.

        The newest are the ones this worker would start last, so what it keeps is what it
        was about to run. Returns the batches (``order[0]``) withdrawn.
        """
        chosen = set(self.unstarted()[:max(0, n)])
        if not chosen:
            return []
        self._withdrawn |= chosen
        for order, _, future in self._waiting:
            if order[0] in chosen and not future.done():
                future.set_exception(HandedBack("withdrawn before it started"))
        # Drop them from the heap now: the newest sit at its bottom and would linger there.
        self._waiting = [entry for entry in self._waiting if not entry[2].done()]
        heapq.heapify(self._waiting)
        return sorted(chosen, reverse=True)

    def forget(self, key) -> None:
        """The batch ``key`` has left the gate for good (ended, failed or withdrawn): drop what is kept of it."""
        self._started.discard(key)
        self._withdrawn.discard(key)

    def _grant(self) -> None:
        while self._waiting and (self._waiting[0][2].done() or self.admitted < self.level):
            order, _, future = heapq.heappop(self._waiting)
            if not future.done():  # cancelled waiters are skipped
                self.admitted += 1
                self.admitted_total += 1
                self._started.add(order[0])
                future.set_result(None)

    def slot(self, order: tuple) -> _Slot:
        """``async with gate.slot(order):`` holds one slot for the block."""
        return _Slot(self, order)


class _Slot:
    def __init__(self, gate: AdmissionGate, order: tuple):
        self._gate, self._order = gate, order

    async def __aenter__(self) -> None:
        await self._gate.acquire(self._order)

    async def __aexit__(self, *exc: object) -> None:
        self._gate.release()
