"""bench/farm_report.py prints only what its figures show: a p99 from enough calls, labels computed."""

from __future__ import annotations

from bench.farm_report import MIN_P99_N, Burst, Tail, _mid_run, bound_by


def test_a_p99_of_too_few_calls_is_printed_as_their_max():
    few = Tail.of("claim", [1.0] * (MIN_P99_N - 3) + [50.0, 500.0])
    assert few.cell() == f"max of {MIN_P99_N - 1}" and few.ms == 500.0 and not few.is_p99
    many = Tail.of("claim", [1.0] * 990 + [500.0] * 10)
    assert many.cell() == "1.0" and many.is_p99  # the 10 slowest of 1,000 are above the p99
    assert "n=1,000" in many.words()


def test_a_max_over_the_goal_from_few_calls_shows_nothing_while_one_under_it_shows_the_goal_met():
    assert Tail.of("commit", [10.0, 150.0]).meets(100.0) is None
    assert Tail.of("commit", [10.0, 50.0]).meets(100.0) is True
    assert Tail.of("commit", [150.0] * MIN_P99_N).meets(100.0) is False


def test_cpu_bound_is_said_only_when_the_cores_were_busy_and_the_backends_not_waiting_on_locks():
    assert bound_by(0.97, 0.02) == "CPU-bound"
    assert bound_by(0.60, 0.02) is None  # idle cores: not the CPU
    assert bound_by(0.97, 0.15) is None  # between: neither shown
    assert bound_by(0.97, 0.40) == "lock-bound"
    assert bound_by(0.97, None) is None  # no backend seen: nothing to say
    assert "CPU-bound" not in Burst(100, 10.0, machine_busy=0.5, lock_share=0.0, samples=40).words()


def test_the_mid_run_rate_is_read_from_the_answers_ends():
    ends = [(float(t), 20.0) for t in range(100)]  # one answer a second, 20 tokens each
    seconds, tokens = _mid_run(ends, 100)
    assert seconds == 80.0 and tokens == 80 * 20.0
    assert _mid_run(ends[:80], 100) is None  # fewer than 90% ended: no rate
