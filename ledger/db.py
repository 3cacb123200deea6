"""Engine and session factory, plus a retry wrapper for ledger writes.

Workers must survive a Postgres restart mid-run: a batch that was uploaded is
recorded once Postgres is back, never generated again. ``retry_db`` retries
operational errors (connection refused/reset, admin shutdown) with backoff.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ledger.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


def make_engine(settings: Settings, **kwargs) -> Engine:
    # pool_pre_ping: a worker idles for an hour between ledger writes; connections
    # may have been cut by a Postgres restart or a proxy in between.
    if settings.database_pooler == "transaction":
        # Through PgBouncer in transaction mode each transaction may run on another server
        # connection: a statement psycopg prepared on one is unknown on the next.
        kwargs["connect_args"] = {**kwargs.get("connect_args", {}), "prepare_threshold": None}
    return create_engine(settings.sqlalchemy_url, pool_pre_ping=True, future=True, **kwargs)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def retry_db(fn: Callable[[], T], *, what: str, max_wait_s: float = 600.0, base_delay_s: float = 0.5,
             stop: threading.Event | None = None) -> T:
    """Run ``fn`` until it succeeds or ``max_wait_s`` of transient failures have passed.

    ``fn`` must be a whole transaction (open a session, do the work, commit), so a
    retry never replays half of one. ``stop``, once set, ends the waiting at once with the last
    failure raised: a worker shutting down hands its batch back rather than wait out a ledger outage.
    """
    deadline = time.monotonic() + max_wait_s
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - filtered just below
            if not _is_transient(exc) or time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                raise
            attempt += 1
            delay = min(30.0, base_delay_s * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.0)
            # Never asleep past the deadline: a caller bounded by it (a shutdown's hand-back) gets its answer on time.
            delay = min(delay, max(0.0, deadline - time.monotonic()))
            log.warning("ledger write %s failed (%s); retry %d in %.1fs", what, type(exc).__name__, attempt, delay)
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):
                raise
