"""The engine-occupancy sampler (worker/engine/occupancy.py): it tells a worker short of work from a slow loop."""

from __future__ import annotations

import asyncio
import logging

from worker.engine.occupancy import OccupancySampler, Window, logged_windows, parse_windows


def test_short_samples_are_told_apart_by_whether_work_waited_at_the_gate():
    w = Window()
    for requests, waiting in ((300, 1), (100, 5), (100, 0), (0, 0), (256, 0)):
        w.add(requests=requests, waiting=waiting, max_num_seqs=256, lag_s=0.002)
    assert (w.samples, w.short_waiting, w.short_idle) == (5, 1, 2)
    assert w.requests_mean == 756 / 5 and w.share(w.short_idle) == 0.4


def test_a_logged_window_reads_back_the_same_and_windows_add_up():
    a, b = Window(), Window()
    for _ in range(10):
        a.add(requests=50, waiting=1, max_num_seqs=32, lag_s=0.001)
    for n in range(30):
        b.add(requests=n, waiting=n % 2, max_num_seqs=32, lag_s=0.010)
    a.tokens, a.at, b.tokens, b.at = 1200, 1764604214.7, 300, 1764604217.7
    lines = ["unrelated log line", a.line(1.0, 32), "x " + b.line(3.0, 32)]
    assert "1,200 output tok/s" in lines[1] and "100 output tok/s" in lines[2]
    assert [(w.tokens, w.at, w.seconds) for w in logged_windows(lines)] == \
        [(1200, 1764604214.7, 1.0), (300, 1764604217.7, 3.0)]
    # A line of an older worker, without the window's length, still reads.
    older = lines[1].replace(" over 1.00]", "]")
    assert [(w.tokens, w.seconds) for w in logged_windows([older])] == [(1200, 0.0)]
    total = parse_windows(lines)
    assert total.tokens == 1500
    expected = a.merge(b)
    assert (total.samples, total.short_waiting, total.short_idle) == (40, 15, 15)
    assert (total.samples, total.short_waiting, total.short_idle) == \
        (expected.samples, expected.short_waiting, expected.short_idle)
    assert abs(total.requests_mean - expected.requests_mean) < 0.1
    assert abs(total.lag_mean_s - expected.lag_mean_s) < 1e-4 and abs(total.lag_max_s - 0.010) < 1e-4


def test_the_sampler_sees_a_blocked_loop_as_lag_and_logs_a_window(caplog):
    held = {"requests": 10, "waiting": 3}
    sampler = OccupancySampler(lambda: held["requests"], lambda: held["waiting"], 32,
                               interval_s=0.01, report_s=0.2)

    async def scenario():
        task = asyncio.ensure_future(sampler.run())
        await asyncio.sleep(0.05)
        import time
        time.sleep(0.15)  # a callback holding the loop (rendering, a parser) for 150 ms
        sampler.ended(40)  # a generation of 40 tokens ends
        await asyncio.sleep(0.15)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="worker.engine.occupancy"):
        asyncio.run(scenario())
    assert sampler.total.lag_max_s >= 0.1
    assert sampler.total.short_waiting == sampler.total.samples > 0   # 10 < 32 with 3 waiting, every sample
    figures = sampler.figures()
    assert figures["short_with_work_seconds"] == sampler.total.samples * 0.01
    assert figures["short_without_work_seconds"] == 0
    lines = [r.getMessage() for r in caplog.records if "engine occupancy" in r.getMessage()]
    assert lines, "a busy window is logged"
    line = lines[0]
    assert "100.0% of the time with conversations waiting" in line
    assert parse_windows([line]).samples > 0
    assert sum(w.tokens for w in logged_windows(lines)) == sampler.total.tokens == 40
    assert all(w.at > 0 and w.seconds >= 0.2 for w in logged_windows(lines))
