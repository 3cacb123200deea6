"""ledger/db.py ``retry_db``: a ledger outage is waited out, but not past a shutdown's ``stop``."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

from ledger.db import retry_db


def _outage(calls: list[float]):
    def fn():
        calls.append(time.monotonic())
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))
    return fn


def test_a_set_stop_ends_the_wait_for_the_ledger_at_once_with_its_failure():
    calls: list[float] = []
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(OperationalError):
        retry_db(_outage(calls), what="read", max_wait_s=600.0, base_delay_s=2.0, stop=stop)
    # Without stop it would sleep 1-2 s, then 2-4 s, ... for ten minutes: the shutdown's hand-back waited on it.
    assert time.monotonic() - started < 1.5
    assert len(calls) == 1


def test_without_stop_the_outage_is_retried_until_the_deadline():
    calls: list[float] = []
    with pytest.raises(OperationalError):
        retry_db(_outage(calls), what="read", max_wait_s=0.6, base_delay_s=0.05)
    assert len(calls) >= 3
