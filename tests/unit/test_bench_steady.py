"""bench/system_run.py's steady-state rate: the middle of a run, its start-up and drain left out."""

from bench.system_run import STEADY, steady_tok_s


def test_the_middle_of_a_run_is_read_without_its_slow_ends():
    # 100 s: a slow first and last 10 s (100 tok/s), 1,000 tok/s between, one end a second.
    finished = [(t + 0.5, 100 if t < 10 or t >= 90 else 1000) for t in range(100)]
    overall = sum(n for _, n in finished) / 100
    steady = steady_tok_s(finished, 0.0, 100.0)
    assert STEADY == (0.2, 0.8)
    assert steady == 1000.0 and overall < 850


def test_too_few_ends_in_the_middle_give_no_figure():
    finished = [(50.0, 5000)] * 4
    assert steady_tok_s(finished, 0.0, 100.0) is None
    assert steady_tok_s(finished, 0.0, 100.0, at_least=4) == 20000 / 60
    assert steady_tok_s(finished, 10.0, 10.0) is None
