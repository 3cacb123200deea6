"""bench/gpu/step_profile.py: a step's time by kernel kind (issue 31's question after the scheduler's settings)."""

from __future__ import annotations

import pytest

from bench.gpu.step_profile import StepProfile, StepProfiler, kind_of, summarize


@pytest.mark.parametrize("name, kind", [
    ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", "attention"),
    ("_fwd_kernel_flash_decode_stage1", "attention"),
    ("reshape_and_cache_flash_kernel", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("nvjet_tst_128x192_64x4_2x1_v_bz_coopA_NTN", "gemm"),
    ("aten::mm", "gemm"),
    ("_topk_topp_kernel", "sampler"),
    ("void at::native::(anonymous namespace)::radixSortKVInPlace<-2, -1, 32, 4, float, long, unsigned int>", "sampler"),
    ("aten::sort", "sampler"),
    ("flash_mla_fwd_kernel", "attention"),
    ("void vllm::rms_norm_kernel_NormLayer", "norm, rotary, activation"),
    ("_C::onednn_mm", "gemm"),
    ("_C::weight_packed_linear", "gemm"),
    ("_temperature_kernel", "sampler"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("Memcpy HtoD (Pinned -> Device)", "memory"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm, rotary, activation"),
    ("void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel>", "norm, rotary, activation"),
    ("some_kernel_nobody_named", "other"),
])
def test_kernels_are_sorted_into_kinds_by_name(name, kind):
    assert kind_of(name) == kind


def test_the_summary_gives_each_kind_per_step_and_the_idle_rest():
    profile = StepProfile(steps=10, wall_s=0.5, running_mean=182.0, kernels={
        "flash_fwd_splitkv_kernel": (200_000.0, 640), "sm90_xmma_gemm_bf16": (150_000.0, 2560),
        "_topk_topp_kernel": (10_000.0, 10)})
    text = summarize(profile)
    assert "10 steps in 0.50 s = 50.0 ms a step, 182 running" in text
    assert "| attention | 20.00 | 40% |" in text
    assert "| gemm | 15.00 | 30% |" in text
    assert "| sampler | 1.00 | 2% |" in text
    # 500 ms of wall, 360 ms of kernels: 14 ms a step with nothing on the device.
    assert "| (device idle: no kernel running) | 14.00 | 28% |" in text
    assert text.index("[attention] flash_fwd") < text.index("[gemm] sm90") < text.index("[sampler]")
    assert "64.0/step" in text


def test_no_steps_says_so():
    assert summarize(StepProfile(steps=0, wall_s=0.0)) == "step profile: no steps recorded"


def test_the_profiler_records_the_steps_it_was_asked_for_with_torchs_profiler():
    import torch

    a = torch.randn(64, 64)
    calls = []

    def step():
        calls.append(1)
        return a @ a

    live = iter(range(1000, 1006))
    profiler = StepProfiler(steps=3, at_s=0.0, running=lambda: 7, on_device=False, live_tokens=lambda: next(live))
    profiler.arm()
    wrapped = profiler.wrap(step)
    for _ in range(6):
        wrapped()
    assert len(calls) == 6  # every step runs; only the window is recorded
    result = profiler.result
    assert result is not None and result.steps == 3 and result.running_mean == 7
    assert result.live_tokens_mean == 1001  # sampled after each of the window's steps: 1000, 1001, 1002
    assert any(kind_of(name) == "gemm" for name in result.kernels), sorted(result.kernels)
    assert "3 steps in" in summarize(result) and "CPU operators" in summarize(result)


def test_a_run_that_ends_inside_the_window_is_summarised_with_what_it_had():
    profiler = StepProfiler(steps=100, at_s=0.0, running=lambda: 1, on_device=False)
    profiler.arm()
    wrapped = profiler.wrap(lambda: None)
    wrapped()
    wrapped()
    profiler.finish()
    assert profiler.result is not None and profiler.result.steps == 2


def test_a_profile_of_no_steps_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        StepProfiler(steps=0, at_s=0.0, running=lambda: 0, on_device=False)


def test_a_device_profile_that_covers_little_of_the_wall_says_graph_replays_may_be_missing():
    sparse = StepProfile(steps=4, wall_s=0.2, kernels={"_topk_topp_kernel": (4_000.0, 4)})
    assert "kernels cover only 2% of the wall" in summarize(sparse)
    dense = StepProfile(steps=4, wall_s=0.2, kernels={"flash_fwd_kernel": (150_000.0, 256)})
    assert "kernels cover only" not in summarize(dense)


def test_device_rows_count_kernels_once_not_their_operators_too():
    from types import SimpleNamespace as Row

    from bench.gpu.step_profile import kernel_times

    rows = [Row(key="aten::mm", device_type="DeviceType.CPU", self_device_time_total=900.0, count=2),
            Row(key="sm90_xmma_gemm_bf16", device_type="DeviceType.CUDA", self_device_time_total=900.0, count=2),
            Row(key="_topk_topp_kernel", device_type="DeviceType.CUDA", self_device_time_total=50.0, count=1)]
    assert kernel_times(rows, on_device=True) == {"sm90_xmma_gemm_bf16": (900.0, 2), "_topk_topp_kernel": (50.0, 1)}
    untyped = [Row(key="k", device_type="", self_device_time_total=10.0, count=1)]
    assert kernel_times(untyped, on_device=True) == {"k": (10.0, 1)}


def test_profile_only_stops_the_run_at_the_step_that_closes_the_window_not_before():
    from bench.gpu.sweep import ProfileTaken, _stop_after

    calls = []
    profiler = StepProfiler(steps=3, at_s=0.0, running=lambda: 1, on_device=False)
    profiler.arm()
    step = _stop_after(profiler, profiler.wrap(lambda: calls.append(1) or ["out"]))
    assert step() == ["out"] and step() == ["out"]  # inside the window: the run goes on
    with pytest.raises(ProfileTaken):
        step()
    assert len(calls) == 3 and profiler.result is not None and profiler.result.steps == 3


def test_with_the_roofline_each_kind_is_read_against_its_floor(tmp_path):
    # The H200's 2026-12-06 window at 289 running on the 32B shape (its kernels' milliseconds, rounded):
    # GEMMs 29.7 ms against 18.2 bound by FLOPs, attention 21.8 against 16.0 bound by bytes.
    import json

    from bench.gpu.bound import H200, Shape, step_floor
    from bench.gpu.model import QWEN3_32B_SHAPES

    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_32B_SHAPES, "vocab_size": 2840}))
    profile = StepProfile(steps=60, wall_s=3.276, running_mean=289.0, live_tokens_mean=292_432.0, kernels={
        "nvjet_sm90_tst_256x96_64x4_4x1_v_bz_coopA_TNT": (1_782_000.0, 4098),
        "flash::FlashAttnFwdSm90": (1_306_000.0, 3840)})
    floor = step_floor(Shape.from_config(tmp_path), 289, 292_432, card=H200)
    text = summarize(profile, floor=floor)
    assert "roofline at 289 running and 292,432 live tokens: 34.2 ms a step (GEMMs 18.2 ms, bound by FLOPs; " \
           "attention 16.0 ms)" in text
    assert "the step ran at 63% of it, the GEMMs at 61% of theirs, the attention at 73% of its" in text
    assert "roofline" not in summarize(profile)  # no card, no floor: the table alone
