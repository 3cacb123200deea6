"""The benchmarks' workload line: generated output lengths beside the requested budgets (bench/lengths.py)."""

from __future__ import annotations

import pytest

from bench.lengths import Lengths, distribution_lines, percentile


def test_percentile_is_the_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 0.99) == 99
    assert percentile(values, 0.5) == 50
    assert percentile([7], 0.99) == 7
    assert percentile([5, 1, 3], 1.0) == 5  # unsorted input


def test_lengths_describe_mean_median_p99_and_the_share_cut():
    got = Lengths.of([10, 20, 30, 40, 1000], cut=2)
    assert got.mean == 220
    assert got.median == 30
    assert got.p99 == 1000 and got.max == 1000
    assert got.cut_share == pytest.approx(0.4)
    assert got.describe() == "mean 220, median 30, p99 1,000, max 1,000; 40.0% cut at their budget"


def test_an_early_ending_model_is_flagged_where_the_figures_are_read():
    # issue 21's shape: budgets of mean ~1,500 generated at a third of it.
    requested = [3000, 1500, 1500, 900, 600]
    lines = distribution_lines(requested, {"a": ([300, 1500, 200, 100, 600], 2), "b": (requested, 5)})
    assert lines[0] == "output lengths requested: mean 1,500, median 1,500, p99 3,000, max 3,000"
    assert lines[1].startswith("(a) generated: mean 540, median 300, p99 1,500, max 1,500; 40.0% cut")
    assert "36% of the requested mean" in lines[1] and "--ignore-eos" in lines[1]
    assert lines[2] == "(b) generated: mean 1,500, median 1,500, p99 3,000, max 3,000; 100.0% cut at their budget"


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        Lengths.of([])
    with pytest.raises(ValueError, match="3 cut at budget out of 2"):
        Lengths.of([1, 2], cut=3)
