"""What both engine hosts share (worker/engine/host.py's vLLM one, worker/engine/fake.py's fake): the event-loop
thread the engine lives on, coroutines submitted to it from the batch threads, and batch admission tickets."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections.abc import Coroutine


class LoopHost:
    """Mixin: the host keeps ``_loop`` (None until started) and ``_tickets`` (an ``itertools.count``)."""

    _loop: asyncio.AbstractEventLoop | None
    _tickets: itertools.count

    def _start_loop(self, name: str) -> threading.Thread:
        """Start the engine's event loop on a daemon thread of its own."""
        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        thread.start()
        return thread

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        """Run a coroutine on the engine loop; cancel the returned future to abort it."""
        if self._loop is None:
            raise RuntimeError("engine not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def new_batch_ticket(self) -> int:
        """Admission order of a batch: batches taken earlier get the engine first."""
        return next(self._tickets)
