"""bench/probe_drain.py's pure parts: the samples carry their own budgets; the summary compares what it was given."""

from __future__ import annotations

from bench.probe_drain import _samples, summary


def test_each_sample_carries_its_rows_budget():
    samples = _samples(40, 120.0, 480)
    budgets = [s["max_tokens"] for s in samples]
    # Lognormal budgets under the cap, not the run's max_tokens for all (the probe would run every one to 480).
    assert all(1 <= b <= 480 for b in budgets) and len(set(budgets)) > 10
    assert all(s["messages"][0]["role"] == "user" for s in samples)


def _arm(arm, drain_s, loss_s, probe_s):
    return {"arm": arm, "drain_s": drain_s, "drain_loss_s": loss_s, "probe_s": probe_s}


def test_summary_sets_the_arms_side_by_side_and_leaves_the_warm_up_out():
    results = [_arm("warm-up (drop)", 99.0, 50.0, 999.0), _arm("keep", 30.0, 1.0, 90.0), _arm("drop", 10.0, 2.0, 70.0),
               _arm("drop", 12.0, 3.0, 74.0), _arm("keep", 34.0, 0.0, 94.0)]
    lines = summary(results)
    assert "| keep | 2 | 30.0, 34.0 | 1.00, 0.00 | 0.50 | 92.0 |" in lines
    assert "| drop | 2 | 10.0, 12.0 | 2.00, 3.00 | 2.50 | 72.0 |" in lines
    assert lines[-1] == ("drop / keep: drain 0.344x, probe 0.783x; loss 2.50 s against 0.50 s "
                         "(each arm's spread: keep 1.00 s, drop 1.00 s)")
