"""The bandwidth bound the GPU benchmarks print (bench/gpu/bound.py), against the published model sizes."""

import json

import pytest

from bench.gpu.bound import H200_BANDWIDTH, Shape, bound_tok_s, seed_hours_line
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
    # Without a bare phase the footprint is unknown, and no phase gets a capacity line.
    text = "\n".join(bound_lines(str(tmp_path), {"b": details["b"]}, {"b": 2984.0}))
    assert "at the cache's capacity (" not in text and "not known" in text
