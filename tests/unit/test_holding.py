"""The batches a worker holds grow when its engine starves for want of work (worker/holding.py)."""

from __future__ import annotations

import threading

from kombu.common import QoS

from worker.holding import CEILING, HoldingController, HoldingPolicy
from worker.occupancy import Window


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
