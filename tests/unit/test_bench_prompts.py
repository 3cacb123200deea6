"""The benchmarks' synthetic workloads: deterministic, the advertised shape, valid producer input."""

from __future__ import annotations

import json
import statistics
from collections import Counter

from bench.prompts import lognormal_lengths, scale_lines, throughput_rows, write_scale_dataset
from producer.dataset.normalize import normalize_row
from producer.dataset.readers import iter_rows


def test_output_budgets_are_long_tailed_with_the_requested_mean_and_cap():
    lengths = lognormal_lengths(20_000, mean=200, cap=1400, seed=3)
    assert lengths == lognormal_lengths(20_000, mean=200, cap=1400, seed=3)
    assert 1 <= min(lengths) and max(lengths) == 1400
    assert 180 <= statistics.mean(lengths) <= 210
    # Long-tailed: the median sits well below the mean, and a few hit the cap.
    assert statistics.median(lengths) < 0.75 * statistics.mean(lengths)
    assert 0 < sum(n == 1400 for n in lengths) < 0.02 * len(lengths)


def test_throughput_rows_normalise_and_carry_their_own_budget():
    rows = throughput_rows(50, seed=1, mean_tokens=100, max_tokens=500)
    assert rows == throughput_rows(50, seed=1, mean_tokens=100, max_tokens=500)
    assert len({r["id"] for r in rows}) == 50
    for row in rows:
        assert 1 <= row["max_tokens"] <= 500
        sample = normalize_row(row)
        assert sample["sample_id"] == row["id"]
        assert [m["role"] for m in sample["messages"]] == ["user"]
        assert len(sample["messages"][0]["content"].split()) >= 10


def test_scale_rows_are_one_to_two_kilobytes_with_a_few_bad_and_duplicate_rows(tmp_path):
    paths = write_scale_dataset(tmp_path / "ds", 6_000, seed=2, files=3)
    assert [p.name for p in paths] == ["part-000.jsonl", "part-001.jsonl", "part-002.jsonl"]
    lines = [line for p in paths for line in p.read_text().splitlines()]
    assert lines == list(scale_lines(6_000, seed=2))
    assert 1000 <= statistics.mean(len(line.encode()) for line in lines) <= 2000

    reasons: Counter[str] = Counter()
    ids: Counter[str] = Counter()
    for raw in iter_rows(paths):
        if raw.error is not None:
            reasons[raw.error.reason] += 1
            continue
        try:
            sample = normalize_row(raw.obj)
        except Exception as e:  # noqa: BLE001 - the InputRowError's reason is what is counted
            reasons[getattr(e, "reason", type(e).__name__)] += 1
            continue
        ids[sample["sample_id"]] += 1
    assert reasons == {"malformed_json": 2, "no_user_turn": 2, "unknown_role": 2}
    assert sum(ids.values()) == 6_000 - 6
    assert sorted(n for n in ids.values() if n > 1) == [2, 2, 2]  # one repeated id per 2,000 rows


def test_an_existing_dataset_is_reused_and_a_different_one_rebuilt(tmp_path):
    first = write_scale_dataset(tmp_path, 100, seed=0, files=2)
    stamp = first[0].stat().st_mtime_ns
    assert write_scale_dataset(tmp_path, 100, seed=0, files=2) == first
    assert first[0].stat().st_mtime_ns == stamp
    write_scale_dataset(tmp_path, 100, seed=1, files=2)
    assert json.loads((tmp_path / "regen_bench_dataset.json").read_text())["seed"] == 1
    assert first[0].read_text().splitlines()[0] != next(scale_lines(100, seed=0))
