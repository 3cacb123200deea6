"""The batches a worker process gave back: not taken again at once, and released however slow the ledger.

Three records, one per question the batch path asks:

* **recently handed back** (by batch, monotonic time): a batch withdrawn for workers below
  their share (worker/batches/holding.py) is not claimed again by this process within one
  probe period, when its share has not been read again;
* **unreleased** (by batch and attempt, with the release's reason): a hand-back whose release
  gave up (a slow or unreachable ledger, issue 36). The heartbeat keeps its lease and retries
  the release every beat (``retry_releases``), so a slow ledger costs it no failure;
* **Redis records** (ledger/handbacks.py): the same hand-back told to the reconciler through
  the broker, so that should the process stop before a retry lands, the lease's expiry counts
  no failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

import redis as redis_lib
from redis.exceptions import RedisError
from sqlalchemy.orm import Session, sessionmaker

from ledger import handbacks
from worker.batches.held import Attempt
from worker.batches.ledger_calls import release_batch

log = logging.getLogger(__name__)

#: Connect and reply timeout of a hand-back record's Redis call (ledger/handbacks.py): a shutdown's
#: hand-back records before it releases, all within ``HAND_BACK_S``.
RECORD_TIMEOUT_S = 1.0


class HandBacks:
    """What this process handed back, the releases still to land, and their Redis records.

    Args:
        redis_url: the broker, where the records go.
        worker: this process's name, the records' value (the reconciler compares it).
        probe_period_s: how long a batch handed back is not taken again (the heartbeat period).
    """

    def __init__(self, redis_url: str, *, worker: str, probe_period_s: float):
        self._redis_url, self._worker, self._period_s = redis_url, worker, probe_period_s
        self._lock = threading.Lock()
        self._recent: dict[int, float] = {}
        self._unreleased: dict[Attempt, str] = {}
        self._client: redis_lib.Redis | None = None

    # -- not taken again at once -------------------------------------------------------------
    def handed_back(self, batch_id: int) -> None:
        """Remember a batch this process gave back, so that it does not take it again at once."""
        now = time.monotonic()
        with self._lock:
            self._recent = {b: t for b, t in self._recent.items() if now - t < self._period_s}
            self._recent[batch_id] = now

    def handed_back_recently(self, batch_id: int) -> float:
        """Seconds until this process may take ``batch_id`` again (0: now): one probe period after it handed it back.

        The probe (worker/batches/holding.py) runs once per heartbeat period: within one, the
        worker's share has not been read again, and a hand-back taken straight back is only churn
        (a claim, an attempt, a release) while the workers it was handed back for wait for it.
        """
        with self._lock:
            at = self._recent.get(batch_id)
        return 0.0 if at is None else max(0.0, at + self._period_s - time.monotonic())

    # -- releases that gave up ----------------------------------------------------------------
    def release_later(self, batch_id: int, attempt: int, reason: str, *, record: bool = True) -> None:
        """A hand-back whose release gave up: the heartbeat keeps its lease and retries the release each beat.

        Recorded in Redis as well (``record`` False: the caller has), so that should the process
        stop before a retry lands, the lease's expiry counts no failure.
        """
        with self._lock:
            self._unreleased[(batch_id, attempt)] = reason
        if record:
            self.record(batch_id, attempt)

    def unreleased(self) -> set[Attempt]:
        """The hand-backs whose release has not landed yet: their leases are the heartbeat's to keep."""
        with self._lock:
            return set(self._unreleased)

    def forget_lost(self, lost: Iterable[Attempt]) -> None:
        """Another attempt has these batches: nothing left to give back."""
        with self._lock:
            for key in lost:
                self._unreleased.pop(key, None)

    def retry_releases(self, sessions: sessionmaker[Session], *, within_s: float) -> None:
        """Try every release still to land, until one gives up (the ledger is still out of reach)."""
        with self._lock:
            pending = dict(self._unreleased)
        for (batch_id, attempt), reason in pending.items():
            if not release_batch(sessions, batch_id, attempt, reason=reason, within_s=within_s):
                return  # the rest wait for the next beat, not the heartbeat
            log.info("batch %s attempt %s released at last (%s)", batch_id, attempt, reason)
            with self._lock:
                self._unreleased.pop((batch_id, attempt), None)
            self.forget(batch_id, attempt)

    # -- Redis records (ledger/handbacks.py) --------------------------------------------------
    def record(self, batch_id: int, attempt: int) -> bool:
        """Tell the reconciler, through Redis, that this attempt was handed back. False: not told."""
        return self.record_all({(batch_id, attempt)})

    def record_all(self, attempts: Iterable[Attempt]) -> bool:
        """``record`` for each attempt, in one round trip (a closing worker's leftovers)."""
        attempts = sorted(attempts)
        try:
            handbacks.record_hand_backs(self._records(), attempts, worker=self._worker)
            return True
        except (RedisError, OSError) as e:
            log.warning("batches %s: their hand-back could not be recorded in Redis either (%s: %s); if a release "
                        "does not land, its lease's expiry counts a failure", [b for b, _ in attempts],
                        type(e).__name__, e)
            return False

    def forget(self, batch_id: int, attempt: int) -> None:
        """The release landed: its record is not needed (a record left behind matches nothing, and expires)."""
        try:
            handbacks.forget_hand_back(self._records(), batch_id, attempt)
        except (RedisError, OSError) as e:
            log.debug("forgetting the hand-back record of batch %s failed: %s", batch_id, e)

    def _records(self) -> redis_lib.Redis:
        """The Redis client of the records: short timeouts, as a shutdown's hand-back is timed."""
        if self._client is None:
            self._client = redis_lib.Redis.from_url(self._redis_url, socket_timeout=RECORD_TIMEOUT_S,
                                                    socket_connect_timeout=RECORD_TIMEOUT_S)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
