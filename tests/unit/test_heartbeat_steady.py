"""When a worker's heartbeats say the ledger is steady enough to take leases over (worker/process/heartbeat.py)."""

from __future__ import annotations

import threading

from worker.process.heartbeat import Heartbeat

LEASE_S, PERIOD_S = 8.0, 1.0


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _heartbeat(clock: _Clock) -> Heartbeat:
    return Heartbeat(None, None, None, period_s=PERIOD_S, lease_s=LEASE_S,  # type: ignore[arg-type]
                     stop=threading.Event(), clock=clock)


def _beats(hb: Heartbeat, clock: _Clock, n: int, every_s: float = PERIOD_S) -> None:
    for _ in range(n):
        clock.now += every_s
        hb._landed(clock())


def test_leases_are_taken_over_only_after_a_whole_lease_of_landed_beats():
    clock = _Clock()
    hb = _heartbeat(clock)
    assert not hb.ledger_steady()  # no beat yet: a new process takes nothing over
    _beats(hb, clock, 1)
    _beats(hb, clock, int(LEASE_S) - 1)
    assert not hb.ledger_steady()
    _beats(hb, clock, 1)
    assert hb.ledger_steady()


def test_a_stall_longer_than_half_a_lease_restarts_the_wait_and_a_silent_ledger_is_not_steady():
    clock = _Clock()
    hb = _heartbeat(clock)
    _beats(hb, clock, 20)
    assert hb.ledger_steady()
    clock.now += LEASE_S / 2 + 0.5  # the ledger answers nothing: asked now (a pass that waited through it)
    assert not hb.ledger_steady()
    clock.now += 45 - LEASE_S / 2 - 0.5
    hb._landed(clock())  # the beat stuck in the stall lands: the run starts again here
    assert not hb.ledger_steady()
    _beats(hb, clock, int(LEASE_S) - 1)
    assert not hb.ledger_steady()
    _beats(hb, clock, 1)
    assert hb.ledger_steady()


def test_gaps_shorter_than_half_a_lease_keep_the_run():
    clock = _Clock()
    hb = _heartbeat(clock)
    _beats(hb, clock, 10, every_s=LEASE_S / 2 - 0.1)
    assert hb.ledger_steady()
