"""The heartbeat of one worker process: the leases of every attempt it holds, renewed each period.

It renews the held attempts (worker/batches/held.py) and the hand-backs whose release has not
landed (worker/batches/hand_backs.py), tells the task threads which attempts a newer one took
over, and retries the releases that gave up. On the process's liveness connection, which no
task thread can take: however many commits queue for the pool behind a slow ledger, every lease
is renewed each beat (issue 36).
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session, sessionmaker

from worker.batches.hand_backs import HandBacks
from worker.batches.held import HeldBatches
from worker.batches.ledger_calls import renew_leases

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews, every ``period_s`` until ``stop``, the leases of ``held`` and of ``hand_backs``' unreleased."""

    def __init__(self, sessions: sessionmaker[Session], held: HeldBatches, hand_backs: HandBacks, *,
                 period_s: float, stop: threading.Event):
        self._sessions, self._held, self._hand_backs = sessions, held, hand_backs
        self.period_s, self._stop = period_s, stop
        self._thread: threading.Thread | None = None

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
        if lost:
            log.warning("batches %s were taken over by a newer attempt; abandoning them", sorted(lost))
            self._held.mark_lost(lost)
            self._hand_backs.forget_lost(lost & unreleased)
        if unreleased - lost:
            self._hand_backs.retry_releases(self._sessions, within_s=max(0.5, self.period_s / 2))
        return True
