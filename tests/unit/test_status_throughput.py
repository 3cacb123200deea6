"""regen status's recent throughput from the batches finished last (producer/monitoring/status.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from producer.monitoring.status import RECENT_BATCHES, RECENT_WINDOW_S, recent_throughput

NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)


def _row(finished_s_ago: float, *, tokens=1000, samples=64, took_s=60.0):
    """(completion_tokens, n_samples, started_at, finished_at, now), as _RECENT returns it."""
    finished = NOW - timedelta(seconds=finished_s_ago)
    return (tokens, samples, finished - timedelta(seconds=took_s), finished, NOW)


def test_no_batch_finished_in_the_window_is_no_throughput_over_the_window():
    assert recent_throughput([], done_batches=5) == ((0.0, 0.0, 0), float(RECENT_WINDOW_S))


def test_a_young_run_is_measured_from_its_first_batch_start():
    rows = [_row(10), _row(40)]                       # the run's only done batches; the first started 100 s ago
    (tokens, samples, n), window_s = recent_throughput(rows, done_batches=2)
    assert (tokens, samples, n, window_s) == (2000.0, 128.0, 2, 100.0)


def test_an_older_run_is_measured_over_the_whole_window():
    rows = [_row(10), _row(40)]
    assert recent_throughput(rows, done_batches=50)[1] == float(RECENT_WINDOW_S)


def test_a_busy_farm_is_measured_over_its_last_batches_only():
    rows = [_row(i * 0.01) for i in range(RECENT_BATCHES)]   # 100 batches/s: 20 s of commits
    (tokens, _, n), window_s = recent_throughput(rows, done_batches=10**6)
    assert n == RECENT_BATCHES - 1 and abs(window_s - (RECENT_BATCHES - 1) * 0.01) < 1e-6
    assert abs(tokens / window_s - 100_000) < 1                # 1,000 tokens a batch, 100 batches/s
