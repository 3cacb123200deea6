"""The roofline the GPU benchmarks print (bench/gpu/bound.py), against the published model sizes."""

import json

import pytest

from bench.gpu.bound import (
    H200,
    H200_BANDWIDTH,
    Card,
    Shape,
    bound_line,
    bound_tok_s,
    card_of,
    seed_hours_line,
    step_floor,
)
from bench.gpu.model import QWEN3_8B_SHAPES, QWEN3_32B_SHAPES
from bench.gpu.sweep import peak_live_tokens
from worker.engine.sizing import LengthMoments


def _shape(tmp_path, shapes: dict, vocab: int) -> Shape:
    (tmp_path / "config.json").write_text(json.dumps({**shapes, "vocab_size": vocab}))
    return Shape.from_config(tmp_path)


@pytest.mark.parametrize(("shapes", "published_b"), [(QWEN3_8B_SHAPES, 8.2), (QWEN3_32B_SHAPES, 32.8)])
def test_the_shapes_count_the_published_parameters(tmp_path, shapes, published_b):
    # With Qwen3's own 151,936-token vocabulary the counts are the model cards' 8.2 B and 32.8 B.
    assert _shape(tmp_path, shapes, 151_936).params / 1e9 == pytest.approx(published_b, abs=0.05)


def test_kv_bytes_and_the_bound(tmp_path):
    shape = _shape(tmp_path, QWEN3_32B_SHAPES, 1000)
    assert shape.kv_bytes_per_token == 64 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (K, V) x bf16
    # 150 sequences holding 275K tokens: weights + KV a step, 150 tokens a step.
    step = shape.weight_bytes + 275_000 * shape.kv_bytes_per_token
    assert bound_tok_s(shape, 150, 275_000) == pytest.approx(150 * H200_BANDWIDTH / step)
    assert bound_tok_s(shape, 0, 0) == 0.0
    assert "115 H200-hours" in seed_hours_line(3309)  # 1.37e9 / 3309 / 3600 = 115.0


def test_a_burst_too_small_to_fill_the_cache_is_told_apart():
    # 384 requests of budget 1,000 after 100-token prompts peak at 384 x 1,075 (t = 975, the last step below 1,000).
    peak, at = peak_live_tokens([100] * 384, [1000] * 384)
    assert (peak, at) == (384 * 1075, 975)
    assert LengthMoments.of([100] * 384, [1000] * 384).footprint() == pytest.approx(600)


def test_each_phase_is_bounded_by_its_own_cache(tmp_path):
    # 2026-12-04's figure of record printed (b)'s bound with (a)'s 275,248-token cache, while (b)'s engine,
    # at 0.95 of the card, had a larger one: a label it had not measured. Each phase now brings its own.
    from bench.gpu.throughput import bound_lines, worker_kv_tokens

    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_32B_SHAPES, "vocab_size": 1000}))
    log = ("INFO worker.engine.host: engine ready: /m (vllm 0.26.0, max_model_len 8192, max_num_seqs 1024, "
           "KV cache 292432 tokens); settings chosen: engine args watermark=0.01\n")
    assert worker_kv_tokens(log) == 292_432
    assert worker_kv_tokens("INFO something else\n") == 0
    moments = LengthMoments.of([100] * 10, [1000] * 10)
    details = {"a": {"kv_tokens": 275_248, "moments": moments}, "b": {"kv_tokens": worker_kv_tokens(log)},
               "c": {"kv_tokens": 0}}
    text = "\n".join(bound_lines(str(tmp_path), details, {"a": 2637.0, "b": 2984.0, "c": 900.0}))
    assert "(a) at the cache's capacity (275,248 tokens" in text
    assert "(b) at the cache's capacity (292,432 tokens" in text
    assert "(c) at the cache's capacity: not known" in text
    # An engine runs at most max_num_seqs, however many its cache would hold: the bound is taken there.
    from bench.gpu.throughput import worker_max_num_seqs

    assert worker_max_num_seqs(log) == 1024 and worker_max_num_seqs("INFO something else\n") == 0
    capped = {"a": {**details["a"], "max_num_seqs": 256}, "b": {**details["b"], "max_num_seqs": worker_max_num_seqs(log)}}
    text = "\n".join(bound_lines(str(tmp_path), capped, {"a": 2637.0, "b": 2984.0}))
    assert "(a) at the cache's capacity (275,248 tokens hold ~459 of them; max_num_seqs 256 runs 256)" in text
    assert "(153,600 tokens x 256 KiB) a step at 256 running" in text  # 256 x a footprint of 600
    assert "(b) at the cache's capacity (292,432 tokens hold ~487 of them):" in text  # 1,024 > 487: no cap
    # Without a bare phase the footprint is unknown, and no phase gets a capacity line.
    text = "\n".join(bound_lines(str(tmp_path), {"b": details["b"]}, {"b": 2984.0}))
    assert "at the cache's capacity (" not in text and "not known" in text


@pytest.mark.parametrize(("smi_name", "label", "tb_s"), [
    ("NVIDIA H200", "H200", 4.8), ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35), ("NVIDIA H100 PCIe", "H100 PCIe", 2.0),
    ("NVIDIA H100 NVL", "H100 NVL", 3.9), ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 2.039),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1.555), ("NVIDIA GH200 480GB", "GH200", None),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000", 1.792), ("NVIDIA L4", "L4", None)])
def test_the_card_is_the_one_nvidia_smi_names_and_an_unknown_one_gets_no_bandwidth(smi_name, label, tb_s):
    card = card_of(smi_name)
    assert card.label == label
    assert (card.bandwidth / 1e12 if card.bandwidth else None) == (pytest.approx(tb_s) if tb_s else None)


def test_an_h100_run_prints_the_h100s_bound_and_h100_hours_not_an_h200s(tmp_path):
    # 2026-12-05: the short workload on an H100 printed "at 4.8 TB/s" and "26 H200-hours": labels it had not measured.
    shape = _shape(tmp_path, QWEN3_8B_SHAPES, 1000)
    h100 = card_of("NVIDIA H100 80GB HBM3")
    line = bound_line(shape, 2000, 400_000, 15_000.0, card=h100)
    assert "at H100 SXM's 3.35 TB/s and 989 TFLOP/s" in line and "4.8" not in line
    # 2,000 running: the GEMMs' FLOPs (2 FLOPs a weight x 2,000 at 989 TFLOP/s) set the step, not the weights' bytes.
    expected = 2000 / (shape.gemm_flops_per_token * 2000 / 989e12 + 400_000 * shape.kv_bytes_per_token / 3.35e12)
    assert f"-> {expected:,.0f} tok/s" in line and "the GEMMs bound by FLOPs" in line
    assert seed_hours_line(15_000.0, card=h100).endswith(f"{1.37e9 / 15_000 / 3600:,.0f} H100 SXM-hours")
    unknown = bound_line(shape, 2000, 400_000, 15_000.0, card=card_of("NVIDIA L4"))
    assert "no bound: L4's bandwidth is not in" in unknown and "tok/s at" not in unknown


def test_the_bench_and_the_estimate_scale_by_the_same_bandwidths():
    from producer.estimate.arithmetic import GPU_BANDWIDTH_TBPS

    smi_names = {"A100": "NVIDIA A100-SXM4-80GB", "L40S": "NVIDIA L40S", "H100": "NVIDIA H100 80GB HBM3",
                 "H200": "NVIDIA H200", "B200": "NVIDIA B200", "RTX-PRO-6000": "NVIDIA RTX PRO 6000 Blackwell"}
    assert set(smi_names) == set(GPU_BANDWIDTH_TBPS)
    for typed, tb_s in GPU_BANDWIDTH_TBPS.items():
        assert card_of(smi_names[typed]).bandwidth == pytest.approx(tb_s * 1e12), typed


def test_the_gemms_flops_are_two_per_weight_they_multiply(tmp_path):
    # Qwen3-32B with its own vocabulary: every weight but the input embedding (a lookup) and the norms.
    shape = _shape(tmp_path, QWEN3_32B_SHAPES, 151_936)
    norms = shape.layers * (2 * shape.hidden + 2 * shape.head_dim) + shape.hidden
    assert shape.gemm_flops_per_token == 2 * (shape.params - shape.vocab * shape.hidden - norms)
    assert shape.gemm_flops_per_token / 1e9 == pytest.approx(64.0, abs=0.1)
    # Attention: Q.K and P.V over one cached token, 64 query heads of 128, 64 layers.
    assert shape.attention_flops_per_cached_token == 4 * 64 * 128 * 64


def test_above_the_cards_ridge_a_step_is_bound_by_the_gemms_flops(tmp_path):
    # A GEMM does `running` FLOPs per weight byte; an H200's ridge is 989 TFLOP/s / 4.8 TB/s = 206 of them.
    shape = _shape(tmp_path, QWEN3_32B_SHAPES, 1000)
    below, above = step_floor(shape, 180, 290_000), step_floor(shape, 289, 292_432)
    assert not below.gemm_compute_bound and below.gemm_s == pytest.approx(shape.weight_bytes / H200_BANDWIDTH)
    assert above.gemm_compute_bound and above.gemm_s == pytest.approx(shape.gemm_flops_per_token * 289 / 989e12)
    # The 2026-12-06 step profile's moment: GEMMs 18.2 ms at best where the bytes alone said 13.0 ms.
    assert above.gemm_s * 1e3 == pytest.approx(18.2, abs=0.1) and shape.weight_bytes / H200_BANDWIDTH * 1e3 < 13.1
    assert above.attention_s == pytest.approx(292_432 * shape.kv_bytes_per_token / H200_BANDWIDTH)
    bandwidth_only = 289 * H200_BANDWIDTH / (shape.weight_bytes + 292_432 * shape.kv_bytes_per_token)
    assert bound_tok_s(shape, 289, 292_432) == pytest.approx(289 / above.seconds)
    assert bound_tok_s(shape, 289, 292_432) < 0.9 * bandwidth_only


def test_a_card_without_flops_gets_the_bandwidth_bound_and_says_so(tmp_path):
    shape = _shape(tmp_path, QWEN3_8B_SHAPES, 1000)
    card = Card("Some card", H200.bandwidth)
    expected = 2000 * H200.bandwidth / (shape.weight_bytes + 400_000 * shape.kv_bytes_per_token)
    assert bound_tok_s(shape, 2000, 400_000, card=card) == pytest.approx(expected)
    line = bound_line(shape, 2000, 400_000, 15_000.0, card=card)
    assert "bandwidth only: its FLOP/s are not in CARDS" in line and "GEMMs" not in line
    assert card_of("NVIDIA RTX PRO 6000 Blackwell").bf16_flops is None
    with pytest.raises(ValueError, match="no bandwidth"):
        step_floor(shape, 10, 1000, card=card_of("NVIDIA L4"))


def test_a_hybrids_step_reads_and_writes_each_running_sequences_state(tmp_path):
    # Qwen3.6-27B's published config (tests/data/models): 16 attention layers keep KV, 48 linear-attention
    # layers a 147 MiB state a sequence, which every decode step reads and writes back (issue 56).
    from pathlib import Path

    published = Path(__file__).resolve().parents[1] / "data" / "models" / "qwen36_27b_config.json"
    (tmp_path / "config.json").write_text(published.read_text())
    shape = Shape.from_config(tmp_path)
    assert shape.kv_bytes_per_token == 16 * 4 * 256 * 2 * 2
    assert shape.state_bytes_per_sequence == 48 * (10240 * 3 * 2 + 48 * 128 * 128 * 4)
    assert shape.params / 1e9 == pytest.approx(26.9, abs=0.05)
    running, live = 175, 175 * 2048
    step = shape.weight_bytes + live * shape.kv_bytes_per_token + running * 2 * shape.state_bytes_per_sequence
    floor = step_floor(shape, running, live, card=Card("bandwidth only", H200_BANDWIDTH))
    assert floor.seconds == pytest.approx(step / H200_BANDWIDTH)
    assert "147 MiB read and written" in bound_line(shape, running, live, 1000.0)
