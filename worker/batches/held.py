"""The batches a worker process runs now, each as (batch id, attempt): what its heartbeat keeps.

Keyed by the attempt as well as the batch (issue 58, item 5): one process can hold two
attempts of one batch. Its attempt 1's lease expired while the ledger was out of reach
(a partition), the reconciler published the batch again, and the new message came back to
this very process, which claimed attempt 2 while attempt 1's thread still generated. Each
attempt then ends on its own: attempt 1 fenced (its commit finds attempt 2 in the ledger),
attempt 2 committed. Keyed by batch alone, attempt 1's end dropped the entry attempt 2's
heartbeat renewed, and attempt 2's lease expired under a live worker, a failure counted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

#: One held attempt: (batch id, attempt), the attempt being the batch's fencing token.
Attempt = tuple[int, int]


class HeldBatches:
    """The (batch, attempt)s this process holds, the ones found taken over, and the most held at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[Attempt] = set()
        #: Held attempts the heartbeat found taken over by a newer one: their threads abandon them.
        self._lost: set[Attempt] = set()
        self._peak = 0

    def hold(self, batch_id: int, attempt: int) -> bool:
        """Hold the batch's attempt; False if this process holds that attempt already (a duplicate delivery)."""
        with self._lock:
            if (batch_id, attempt) in self._held:
                return False
            self._held.add((batch_id, attempt))
            self._lost.discard((batch_id, attempt))
            self._peak = max(self._peak, len(self._held))
            return True

    def drop(self, batch_id: int, attempt: int) -> None:
        """The attempt's thread is done with it (committed, fenced, failed or handed back)."""
        with self._lock:
            self._held.discard((batch_id, attempt))
            self._lost.discard((batch_id, attempt))

    def mark_lost(self, attempts: Iterable[Attempt]) -> None:
        """The heartbeat found these attempts taken over; those still held are abandoned by their threads."""
        with self._lock:
            self._lost |= set(attempts) & self._held

    def is_lost(self, batch_id: int, attempt: int) -> bool:
        with self._lock:
            return (batch_id, attempt) in self._lost

    def attempts(self) -> set[Attempt]:
        """A copy of what is held now: the leases the next beat renews."""
        with self._lock:
            return set(self._held)

    def count(self) -> int:
        with self._lock:
            return len(self._held)

    def take_peak(self) -> int:
        """The most attempts held at once since the last call (worker/batches/holding.py)."""
        with self._lock:
            peak, self._peak = max(self._peak, len(self._held)), len(self._held)
            return peak
