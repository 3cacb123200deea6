"""The heartbeat of one worker process: the leases of every attempt it holds, renewed each period.

It renews the held attempts (worker/batches/held.py) and the hand-backs whose release has not
landed (worker/batches/hand_backs.py), tells the task threads which attempts a newer one took
over, and retries the releases that gave up. On the process's liveness connection, which no
task thread can take: however many commits queue for the pool behind a slow ledger, every lease
is renewed each beat (issue 36).

It is also this process's evidence that the ledger answers (issue 58, item 3). A ledger that
stops answering for longer than a lease (a frozen host, a partition, a stalled pooler) and then
comes back the same server finds every running batch's heartbeat older than a lease: expired on
the ledger's clock, though every worker kept working and beating all along. So the reconciler
and the claims of this process take a lease over only once its own beats have landed, one
period after the other, for a whole lease (``ledger_steady``): by then every live worker's beat
has landed too, and a lease still old is a worker that stopped, not a ledger that was away. A
gap between two landed beats longer than half a lease breaks the run: a silence that long is
the ledger's (no beat could land), and a shorter one adds less than half a lease to any age.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from worker.batches.hand_backs import HandBacks
from worker.batches.held import HeldBatches
from worker.batches.ledger_calls import renew_leases

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews, every ``period_s`` until ``stop``, the leases of ``held`` and of ``hand_backs``' unreleased."""

    def __init__(self, sessions: sessionmaker[Session], held: HeldBatches, hand_backs: HandBacks, *,
                 period_s: float, lease_s: float, stop: threading.Event,
                 clock: Callable[[], float] = time.monotonic):
        self._sessions, self._held, self._hand_backs = sessions, held, hand_backs
        self.period_s, self.lease_s, self._stop = period_s, lease_s, stop
        self._thread: threading.Thread | None = None
        self._clock = clock
        #: When (monotonic) the last beat landed, and since when they have landed with no long gap.
        self._landed_at: float | None = None
        self._steady_since: float | None = None
        #: The longest gap between two landed beats that keeps them a steady run: half a lease, or two
        #: periods where beats are that sparse (else a lease would never be taken over).
        self.max_gap_s = max(lease_s / 2, 2 * period_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ledger-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.beat()

    def beat(self) -> bool:
        """One beat; False if the ledger did not answer (the next beat tries again)."""
        unreleased = self._hand_backs.unreleased()
        try:
            lost = renew_leases(self._sessions, self._held.attempts() | unreleased)
        except Exception as e:  # noqa: BLE001 - a ledger outage must not kill the heartbeat thread
            log.warning("heartbeat failed (%s); retrying in %ss", type(e).__name__, self.period_s)
            return False
        self._landed(self._clock())
        if lost:
            log.warning("batches %s were taken over by a newer attempt; abandoning them", sorted(lost))
            self._held.mark_lost(lost)
            self._hand_backs.forget_lost(lost & unreleased)
        if unreleased - lost:
            self._hand_backs.retry_releases(self._sessions, within_s=max(0.5, self.period_s / 2))
        return True

    def _landed(self, now: float) -> None:
        if self._landed_at is None or now - self._landed_at > self.max_gap_s:
            if self._landed_at is not None:
                log.warning("the ledger answered no heartbeat for %.0f s: no lease is taken over by this worker "
                            "for the next %.0f s, while every worker's heartbeat lands", now - self._landed_at,
                            self.lease_s)
            self._steady_since = now
        self._landed_at = now

    def ledger_steady(self) -> bool:
        """Whether this process's beats have landed, with no gap over ``max_gap_s``, for a whole lease up to now.

        Asked by the reconciler inside its pass's transaction, after its first statement
        returned: a pass that waited through a stall asks after it, when the beats' run is broken.
        """
        now = self._clock()
        landed_at, since = self._landed_at, self._steady_since
        if landed_at is None or since is None or now - landed_at > self.max_gap_s:
            return False
        return now - since >= self.lease_s
