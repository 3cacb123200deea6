"""The batch path's side of an engine death: no batch charged, the poison found (ledger/crash_suspects.py).

``take_suspects`` fills a batch's ``Flight`` (worker/engine/isolation.py) with the suspects its
claim returned, before it runs; ``record_engine_death`` writes, when the engine died under it,
which of its conversations were in flight and which ran isolated.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session, sessionmaker

from ledger.crash_suspects import Suspects, record_crash
from ledger.db import retry_db
from worker.engine.isolation import Flight

log = logging.getLogger(__name__)

#: How long an engine death's record may wait on the ledger: the process exits next, and a lost
#: record costs one more death before the poison is found, not a sample or a batch.
RECORD_WITHIN_S = 30.0


def take_suspects(flight: Flight, batch_id: int, suspects: Suspects) -> None:
    """Give the batch's ``flight`` the suspects its claim returned: the condemned fail unrun, the others run isolated."""
    if suspects.condemned or suspects.isolate:
        log.warning("batch %s: %d samples failed as engine_crash (%s), %d run isolated: in flight at engine deaths",
                    batch_id, len(suspects.condemned), sorted(suspects.condemned)[:5], len(suspects.isolate))
    flight.isolate, flight.condemned = suspects.isolate, dict(suspects.condemned)


def record_engine_death(sessions: sessionmaker[Session], batch_id: int, flight: Flight, *, worker: str) -> None:
    """Record the batch's conversations in flight when the engine died; a failure to is logged, not raised."""
    in_flight, isolated = set(flight.started), set(flight.isolated)
    if not in_flight:
        return

    def tx() -> None:
        with sessions.begin() as s:
            record_crash(s, batch_id, in_flight, isolated=isolated, worker=worker)

    try:
        retry_db(tx, what=f"record the engine death's suspects of batch {batch_id}", max_wait_s=RECORD_WITHIN_S)
    except Exception as e:  # noqa: BLE001 - the batch is handed back all the same; the next death records again
        log.warning("batch %s: its %d samples in flight at the engine's death could not be recorded (%s: %s)",
                    batch_id, len(in_flight), type(e).__name__, e)
        return
    log.warning("batch %s: the engine died with %d of its samples in flight%s: recorded as suspects", batch_id,
                len(in_flight), f", {sorted(isolated)} isolated" if isolated else "")
