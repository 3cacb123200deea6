"""bench/system_run.py's steady-state rate: the middle of a run, its start-up and drain left out."""

from bench.system_run import STEADY, run_profile, steady_tok_s, steady_window_tok_s


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


def test_windows_count_by_the_share_of_them_inside_the_middle():
    # A 90-s run: its middle (18-72 s, 54 s) is no whole number of 5-s windows, and its edges cut two.
    windows = [(t0, t0 + 5.0, 5000) for t0 in range(3, 88, 5)]  # 1,000 tok/s throughout
    assert abs(steady_window_tok_s(windows, 0.0, 90.0) - 1000.0) < 1e-9
    # Counted whole by their ends, 11 windows end in the middle: 55,000 tokens over 54 s, 2% high.
    by_end = steady_tok_s([(t1, n) for _, t1, n in windows], 0.0, 90.0, at_least=5)
    assert by_end is not None and abs(by_end - 55000 / 54) < 1e-9


def test_windows_of_two_worker_processes_add_up_and_a_gap_counts_as_nothing():
    one = [(float(t0), t0 + 5.0, 5000) for t0 in range(0, 100, 5)]          # 1,000 tok/s
    other = [(t0 + 2.5, t0 + 7.5, 2500) for t0 in range(0, 95, 5)]           # 500 tok/s, offset
    assert steady_window_tok_s(one + other, 0.0, 100.0) == 1500.0
    gap = [w for w in one if not 40 <= w[0] < 60]                             # idle 20 s of the 60-s middle
    assert abs(steady_window_tok_s(gap, 0.0, 100.0) - 1000.0 * 40 / 60) < 1e-9
    assert steady_window_tok_s(one[:3], 0.0, 100.0) is None                  # nothing in the middle


def test_a_runs_profile_shows_where_it_lost_time():
    # The first run's slow first and last 10 s show in its first and last parts, not in its middle.
    finished = [(t + 0.5, 100 if t < 10 or t >= 90 else 1000) for t in range(100)] + [(100.0, 1000)]
    head, middle, tail = run_profile(0.0, 100.0, finished=finished)
    assert (head, middle) == ((10 * 100 + 10 * 1000) / 20, 1000.0)
    assert tail == (10 * 1000 + 10 * 100 + 1000) / 20      # the request ending at the run's end counts
    # From windows: 1,000 tok/s throughout reads the same in every part, whatever the cuts.
    windows = [(t0, t0 + 5.0, 5000) for t0 in range(0, 90, 5)]
    assert all(abs(x - 1000.0) < 1e-9 for x in run_profile(0.0, 90.0, windows=windows))
    assert run_profile(5.0, 5.0, windows=windows) is None
