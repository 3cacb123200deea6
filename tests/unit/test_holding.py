"""The batches a worker holds grow when its engine starves for want of work (worker/batches/holding.py)."""

from __future__ import annotations

import threading

from kombu.common import QoS

from worker.batches.backlog import Backlog
from worker.batches.holding import (
    CEILING,
    HoldingController,
    HoldingPolicy,
    Sharing,
    bounded_limit,
    fair_share,
    share_bound,
    to_hand_back,
)
from worker.engine.occupancy import Window


def _window(samples: int, short_idle: int, short_waiting: int = 0) -> Window:
    w = Window()
    for n in range(samples):
        if n < short_idle:
            w.add(requests=10, waiting=0, max_num_seqs=32, lag_s=0.0)
        elif n < short_idle + short_waiting:
            w.add(requests=10, waiting=4, max_num_seqs=32, lag_s=0.0)
        else:
            w.add(requests=48, waiting=4, max_num_seqs=32, lag_s=0.0)
    return w


def test_it_grows_only_when_the_engine_starved_with_every_allowed_batch_held():
    policy = HoldingPolicy.derived(6)
    assert policy.ceiling == 6 * CEILING
    starved = _window(50, short_idle=11)                     # 22% short, nobody waiting at the gate
    assert policy.next_limit(6, starved, held_peak=6) == 8   # a quarter more, rounded up
    assert policy.next_limit(6, starved, held_peak=5) == 6   # the queue gave no more: a run's end
    assert policy.next_limit(6, _window(50, short_idle=1), held_peak=6) == 6       # 2%: noise
    # Short while conversations waited at the gate: the loop, not the held work, is slow.
    assert policy.next_limit(6, _window(50, short_idle=0, short_waiting=30), held_peak=6) == 6
    assert policy.next_limit(6, _window(5, short_idle=5), held_peak=6) == 6        # too few samples
    assert policy.next_limit(23, starved, held_peak=23) == 24                       # capped at the ceiling
    assert policy.next_limit(24, starved, held_peak=24) == 24


def test_the_controller_drives_celerys_prefetch_count_and_keeps_it_across_a_consumer_restart():
    applied: list[int] = []
    windows = [_window(50, short_idle=20), _window(50, short_idle=0), _window(50, short_idle=20)]
    controller = HoldingController(HoldingPolicy.derived(8), window=lambda: windows.pop(0),
                                   held_peak=lambda: 100, stop=threading.Event())
    qos = QoS(lambda prefetch_count: applied.append(prefetch_count), 32)  # Celery starts at the pool size
    controller.attach(qos)
    assert applied == [8] and qos.value == 8
    assert controller.step() == 10 and qos.value == 10
    assert applied == [8], "the consumer's own thread applies the change (QoS.update), not this one"
    qos.update()
    assert applied == [8, 10]
    assert controller.step() == 10                      # an engine kept full: no change
    # A reconnect: Celery rebuilds its QoS at the pool size, the step hands it over again.
    restarted = QoS(lambda prefetch_count: applied.append(prefetch_count), 32)
    controller.attach(restarted)
    assert applied[-1] == 10
    assert controller.step() == 13 and restarted.value == 13


# --- bounded by the backlog ------------------------------------------------------------------

def _backlog(open_batches: int, *, waiting: int = 0, planned: bool = False, live_gpus: int = 2) -> Backlog:
    return Backlog(open_batches=open_batches, waiting=waiting, planned=planned, live_gpus=live_gpus)


def test_the_fair_share_splits_what_is_open_by_gpus_and_tolerates_an_eighth_more():
    assert fair_share(_backlog(7808, live_gpus=64), 1) == 122          # 64 H200s at the queue's end
    assert fair_share(_backlog(100, live_gpus=3), 1) == 34             # rounded up: the shares cover it all
    assert fair_share(_backlog(100, live_gpus=64), 16) == 25           # a fake worker standing for 16 GPUs
    assert fair_share(_backlog(100, live_gpus=0), 1) == 100            # not registered yet: itself at least
    assert share_bound(_backlog(7808, live_gpus=64), 1) == 122 + 16
    assert share_bound(_backlog(3, live_gpus=3), 1) == 2               # at least one batch of slack
    assert share_bound(_backlog(0, live_gpus=3), 1) == 1


def test_near_the_end_the_limit_is_capped_by_the_share_but_not_below_the_floor_while_the_queue_has_work():
    # Far from the end the share is large: the grown limit stands.
    assert bounded_limit(488, floor=26, backlog=_backlog(100_000, waiting=6000, live_gpus=64), gpus=1) == 488
    # A whole 914K run for 64 GPUs: a worker grown to 488 holds no more than its share of it (224 + 28).
    assert bounded_limit(488, floor=26, backlog=_backlog(14_285, waiting=6000, live_gpus=64), gpus=1) == 252
    # 2,000 open for 64 GPUs with work still queued: the share (32 + 4), not the 488 a grown worker reached.
    assert bounded_limit(488, floor=26, backlog=_backlog(2000, waiting=100, live_gpus=64), gpus=1) == 36
    # Fewer left than fill the gate, but the queue still has work (planned): the floor keeps the engine fed.
    assert bounded_limit(488, floor=26, backlog=_backlog(640, planned=True, live_gpus=64), gpus=1) == 26
    # The queue is empty: nothing to take but what others hand back, so no floor.
    assert bounded_limit(488, floor=26, backlog=_backlog(640, live_gpus=64), gpus=1) == 12
    # Never above what it grew to, never 0 (Celery's prefetch 0 means unlimited), unbounded without a reading.
    assert bounded_limit(10, floor=26, backlog=_backlog(5000, waiting=1, live_gpus=2), gpus=1) == 10
    assert bounded_limit(10, floor=1, backlog=_backlog(1, live_gpus=2), gpus=1) == 2
    # Nothing open at all: a run submitted now is taken at full speed, not a batch per worker.
    assert bounded_limit(10, floor=1, backlog=_backlog(0, live_gpus=2), gpus=1) == 10
    assert bounded_limit(10, floor=1, backlog=None, gpus=1) == 10


def test_it_hands_back_beyond_its_bound_only_when_the_queue_is_empty_and_others_share_the_run():
    # Worker A took the whole run of 40 alone; B joined: share 20, bound 23.
    assert to_hand_back(40, backlog=_backlog(40, live_gpus=2), gpus=1) == 17
    assert to_hand_back(23, backlog=_backlog(40, live_gpus=2), gpus=1) == 0      # within the slack
    assert to_hand_back(40, backlog=_backlog(40, waiting=1, live_gpus=2), gpus=1) == 0   # others can take queued
    assert to_hand_back(40, backlog=_backlog(40, planned=True, live_gpus=2), gpus=1) == 0
    assert to_hand_back(40, backlog=_backlog(40, live_gpus=1), gpus=1) == 0      # alone: nobody to give to
    assert to_hand_back(40, backlog=None, gpus=1) == 0
    # A worker standing for 3 of 4 GPUs keeps three quarters (30 + 4).
    assert to_hand_back(40, backlog=_backlog(40, live_gpus=4), gpus=3) == 6


class _Sharing:
    """A scripted backlog and a held count for the controller (the real probe is tested against Redis)."""

    def __init__(self, readings: list[Backlog], held: int):
        self.readings, self.held_now = readings, held
        self.handed: list[int] = []

    def sharing(self) -> Sharing:
        def hand_back(n: int) -> int:
            self.handed.append(n)
            self.held_now -= n
            return n

        return Sharing(probe=lambda: self.readings.pop(0), held=lambda: self.held_now, floor=lambda: 4,
                       hand_back=hand_back, gpus=1, period_s=0.0)


def test_the_controller_lowers_its_prefetch_before_handing_back_and_raises_it_when_work_returns(monkeypatch):
    monkeypatch.setattr("worker.batches.holding.BRPOP_S", 0.0)
    script = _Sharing([_backlog(40, live_gpus=2), _backlog(20, live_gpus=2), _backlog(400, waiting=300)], held=40)
    applied: list[int] = []
    stop = threading.Event()
    controller = HoldingController(HoldingPolicy(start=40, ceiling=160), window=lambda: None, held_peak=lambda: 40,
                                   stop=stop, sharing=script.sharing())
    qos = QoS(lambda prefetch_count: applied.append(prefetch_count), 160)
    controller.attach(qos)

    def consumer_loop() -> None:  # Celery's consumer thread applies a changed prefetch at each turn of its loop
        while not stop.wait(0.01):
            qos.update()

    threading.Thread(target=consumer_loop, daemon=True).start()
    seen: list[int] = []
    real_hand_back = controller.sharing.hand_back
    controller.sharing.hand_back = lambda n: (seen.append(applied[-1]), real_hand_back(n))[1]
    try:
        # Queue empty, a second worker live, 40 held of 40 open: bound 20 + 3; the 17 beyond it go back,
        # only once the consumer runs with a prefetch of 23 (else it could take them straight back).
        assert controller.step() == 23
        assert script.handed == [17] and seen == [23]
        # 20 open now, 23 held: bound 10 + 2; 11 more go back.
        assert controller.step() == 12 and script.handed == [17, 11] and seen == [23, 12]
        # A new run fills the queue: the grown limit again (400 open, 1 GPU of 2 live: far above 40).
        assert controller.step() == 40 and qos.value == 40 and script.handed == [17, 11]
    finally:
        stop.set()


def test_a_capped_worker_does_not_grow_and_a_failed_read_drops_the_bound():
    def broken() -> Backlog:
        raise ConnectionError("redis is down")

    readings = [_backlog(30, waiting=5, live_gpus=4)]
    sharing = Sharing(probe=lambda: readings.pop(0) if readings else broken(), held=lambda: 8, floor=lambda: 4,
                      hand_back=lambda n: 0, gpus=1, period_s=0.0)
    controller = HoldingController(HoldingPolicy.derived(8), window=lambda: _window(50, short_idle=20),
                                   held_peak=lambda: 100, stop=threading.Event(), sharing=sharing)
    # Grown to 10 by the starving window, then capped: share 8 of 30 open for 4 GPUs, plus 1.
    assert controller.step() == 9 and controller.grown == 10
    # Capped on purpose, so the starving window does not grow it; the read fails: the grown limit again.
    assert controller.step() == 10 and controller.grown == 10
    assert controller.backlog is None
