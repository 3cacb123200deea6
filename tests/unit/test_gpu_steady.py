"""bench.gpu.steady's and bench.gpu.sweep's settings (bench/gpu/live.py) and the comparison with the controls."""

import pytest

from bench.gpu.live import Settings, parse_settings, set_tier_loads, tier_line, time_mean
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
    # offload=off: the only setting that stops loads from the KV cache's CPU tier.
    assert parse_settings("default", **KW).loads is True
    off = parse_settings("watermark=0.01,offload=off", **KW)
    assert (off.watermark, off.loads) == (0.01, False)
    # A segment carries its settings unchanged to the live scheduler.
    assert Segment(fill).settings == fill
    assert Segment(off).settings == off


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(SystemExit, match="unknown setting 'watermrk'"):
        parse_settings("watermrk=0.01", **KW)


def test_each_candidate_is_compared_with_the_defaults_just_beside_it():
    labels = ["default", "fill=1.0", "default", "watermark=0.01", "default", "gmu"]
    segs = [Segment(Settings(x, 1024, 0.0, 16_384)) for x in labels]
    assert neighbour_controls(segs, 1) == [segs[0], segs[2]]
    assert neighbour_controls(segs, 3) == [segs[2], segs[4]]
    assert neighbour_controls(segs, 5) == [segs[4]]  # the last: one control, before it
    # --control: candidates measured against regen's own settings rather than vLLM's defaults.
    assert neighbour_controls(segs, 4, "watermark=0.01") == [segs[3]]
    assert neighbour_controls(segs, 2, "fill=1.0") == [segs[1]]


def test_running_and_kv_means_are_weighted_by_step_time():
    # One long step at 100 running outweighs ten short ones at 10: the drain's many short steps
    # must not pull a segment's mean concurrency down.
    assert time_mean([(100, 1.0)] + [(10, 0.01)] * 10) == pytest.approx((100 + 1.0) / 1.1)
    assert time_mean([]) == 0.0


class _TierConnector:
    """What set_tier_loads reaches of vLLM's OffloadingConnector (CUDA only: vLLM's CPU build refuses
    to build one, "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs")."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def get_num_new_matched_tokens(self, request, num_computed_tokens, **kwargs):
        self.asked.append((request, num_computed_tokens, kwargs))
        return self.answer


class _Scheduler:
    def __init__(self, connector):
        self.connector = connector


def test_offload_off_recomputes_what_the_tier_would_load_and_on_restores_its_answer():
    connector = _TierConnector((640, True))
    scheduler = _Scheduler(connector)
    set_tier_loads(scheduler, False)
    # The connector still looked the request up (its bookkeeping runs), and the scheduler hears 0.
    assert scheduler.connector.get_num_new_matched_tokens("r1", 16, max_num_new_tokens=99) == (0, False)
    assert connector.asked == [("r1", 16, {"max_num_new_tokens": 99})]
    # A deferred lookup (transfers in flight) stays deferred, so the request is not admitted half-stored.
    connector.answer = (None, False)
    assert scheduler.connector.get_num_new_matched_tokens("r2", 0) == (None, False)
    connector.answer = (640, True)
    set_tier_loads(scheduler, False)  # twice off, then on: the original answer, not a wrapper's
    set_tier_loads(scheduler, True)
    assert scheduler.connector.get_num_new_matched_tokens("r3", 0) == (640, True)


def test_offload_off_on_an_engine_without_a_tier_is_refused_and_on_is_a_no_op():
    set_tier_loads(_Scheduler(None), True)
    with pytest.raises(SystemExit, match="no KV connector.*kv_offloading_size"):
        set_tier_loads(_Scheduler(None), False)


def test_the_engine_line_says_whether_and_how_the_kv_cache_has_a_cpu_tier():
    class Cfg:
        kv_transfer_config = None

    assert tier_line(Cfg()) == "; no CPU tier for the KV cache"

    class Kt:
        kv_connector = "OffloadingConnector"
        kv_connector_extra_config = {"cpu_bytes_to_use": 40 * 2**30, "offload_prompt_only": False}

    Cfg.kv_transfer_config = Kt()
    assert tier_line(Cfg()) == "; KV cache's CPU tier: OffloadingConnector, 40 GiB, offload_prompt_only False"


def test_offload_off_is_refused_before_the_first_run_on_an_engine_without_a_tier():
    from bench.gpu.live import check_tries

    every = [parse_settings(x, **KW) for x in ("default", "watermark=0.01,offload=off")]
    with pytest.raises(SystemExit, match="no KV connector"):
        check_tries(_Scheduler(None), every)
    check_tries(_Scheduler(_TierConnector((0, False))), every)
    check_tries(_Scheduler(None), every[:1])
