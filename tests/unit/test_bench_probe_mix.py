"""bench/probe_mix.py: the renewal simulation behind the probe's settled phase (docs/estimate.md)."""

from __future__ import annotations

import pytest

from bench.probe_mix import simulate, stationary_context, windows


def test_a_long_runs_context_is_length_biased():
    # Half the sequences 10 tokens, half 30: a random step is in a 30-token one 3 times in 4, at its
    # middle on average: (10^2 + 30^2) / 2 / (2 x 20) = 12.5 tokens, plus the prompt.
    assert stationary_context([10, 30], prompt_tokens=5) == pytest.approx(17.5)
    # One length: ages uniform over 0..L-1 average (L-1)/2; the formula's L/2 is the continuous limit.
    assert stationary_context([100], prompt_tokens=0) == pytest.approx(50.0)


def test_slots_of_one_length_restart_together_and_count_each_step_once():
    ctx = simulate([4], slots=3, steps=9, prompt_tokens=10, seed=0)
    # All start at 0, run 4 steps, restart at once: ages 0,1,2,3,0,1,2,3,0.
    assert ctx == [10, 11, 12, 13, 10, 11, 12, 13, 10]


def test_a_burst_starts_young_and_reaches_a_long_runs_mix():
    lengths = [20] * 9 + [200]  # a long tail: the 200-token ones hold most of a long run's steps
    spans = ((0.0, 0.25), (2.0, 4.0))
    early, late = windows(lengths, slots=200, prompt_tokens=0, seeds=3, t1=200, spans=spans)
    # The burst's first quarter holds young sequences only; two turnovers of the longest later the
    # mix is a long run's, and the seeds agree on it.
    assert early.share_of_long_run < 0.6
    assert late.share_of_long_run == pytest.approx(1.0, abs=0.05)
    assert 0 < late.spread < 0.05
