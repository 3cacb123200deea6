"""bench.gpu.steady's and bench.gpu.sweep's settings (bench/gpu/live.py) and the comparison with the controls."""

import pytest

from bench.gpu.live import Settings, parse_settings, time_mean
from bench.gpu.steady import Segment, neighbour_controls
from worker.engine.sizing import fitting_level

KW = {"kv_tokens": 275_248, "footprint": 1_620.0, "default_cap": 1024, "default_batched": 16_384}


def test_each_setting_changes_only_what_it_names():
    assert parse_settings("default", **KW) == Settings("default", 1024, 0.0, 16_384, True)
    assert parse_settings("watermark=0.01", **KW) == Settings("watermark=0.01", 1024, 0.01, 16_384, True)
    assert parse_settings("cap=200,batched=8192", **KW) == Settings("cap=200,batched=8192", 200, 0.0, 8192, True)
    # fill: the cap regen's sizing picks for that share of the cache (~170 for these lengths).
    fill = parse_settings("fill=1.0", **KW)
    assert fill.cap == fitting_level(275_248, 1_620.0, default_level=1024, fill=1.0) == 169
    # gmu: the only setting that lets the engine use the blocks held back for --as-built.
    assert parse_settings("gmu", **KW).hold is False
    # A segment carries its settings unchanged to the live scheduler.
    assert Segment.of(fill).settings == fill


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(SystemExit, match="unknown setting 'watermrk'"):
        parse_settings("watermrk=0.01", **KW)


def test_each_candidate_is_compared_with_the_defaults_just_beside_it():
    labels = ["default", "fill=1.0", "default", "watermark=0.01", "default", "gmu"]
    segs = [Segment(x, 1024, 0.0, 16_384, True) for x in labels]
    assert neighbour_controls(segs, 1) == [segs[0], segs[2]]
    assert neighbour_controls(segs, 3) == [segs[2], segs[4]]
    assert neighbour_controls(segs, 5) == [segs[4]]  # the last: one control, before it


def test_running_and_kv_means_are_weighted_by_step_time():
    # One long step at 100 running outweighs ten short ones at 10: the drain's many short steps
    # must not pull a segment's mean concurrency down.
    assert time_mean([(100, 1.0)] + [(10, 0.01)] * 10) == pytest.approx((100 + 1.0) / 1.1)
    assert time_mean([]) == 0.0
