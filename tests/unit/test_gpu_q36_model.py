"""The GPU benchmark's Qwen3.6-27B shapes (bench/gpu/model.py) and the MTP table's arithmetic (bench/gpu/mtp_table.py)."""

from __future__ import annotations

import json

import pytest

from bench.gpu.model import build
from bench.gpu.mtp_table import break_even


@pytest.fixture(scope="module")
def q36_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("q36")
    return build(root / "text", "q36"), build(root / "nested", "q36-mtp")


def test_the_q36_shape_is_the_published_hybrid_text_model(q36_models):
    from transformers import AutoConfig

    text, _ = q36_models
    config = AutoConfig.from_pretrained(text)
    assert config.model_type == "qwen3_5_text"
    assert config.architectures == ["Qwen3_5ForCausalLM"]
    # 64 layers, every 4th full attention: 48 Gated DeltaNet + 16 attention, as published.
    assert config.layer_types.count("linear_attention") == 48
    assert [i for i, t in enumerate(config.layer_types) if t == "full_attention"] == list(range(3, 64, 4))
    assert (config.num_key_value_heads, config.head_dim) == (4, 256)
    assert (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim) == (16, 48, 128)
    assert config.mamba_ssm_dtype == "float32" and config.mtp_num_hidden_layers == 1
    # The dense shapes' sliding-window keys would make it another model: none are left.
    assert "sliding_window" not in json.loads((text / "config.json").read_text())


def test_the_mtp_form_nests_the_same_text_model_under_the_published_model_type(q36_models):
    from transformers import AutoConfig

    text, nested = q36_models
    config = AutoConfig.from_pretrained(nested)
    # vLLM maps model type qwen3_5 (not qwen3_5_text) to its qwen3_5_mtp draft: the reason for this form.
    assert config.model_type == "qwen3_5"
    inner = config.get_text_config()
    flat = AutoConfig.from_pretrained(text)
    for key in ("num_hidden_layers", "layer_types", "hidden_size", "intermediate_size", "vocab_size",
                "linear_num_value_heads", "mtp_num_hidden_layers"):
        assert getattr(inner, key) == getattr(flat, key), key
    assert json.loads((nested / "config.json").read_text())["architectures"] == ["Qwen3_5ForCausalLM"]


def test_break_even_interpolates_where_the_speedup_crosses_one():
    assert break_even({0.6: 0.8, 0.75: 1.1, 0.9: 1.3}) == "pays above ~0.70"
    assert break_even({0.6: 1.05, 0.75: 1.2}).startswith("pays at every rate")
    assert break_even({0.6: 0.7, 0.9: 0.95}) == "does not pay up to 0.9"


def test_the_nested_form_made_from_a_q36_folder_is_the_built_one(q36_models, tmp_path):
    from bench.gpu.model import nest_copy

    text, nested = q36_models
    copy = nest_copy(text, tmp_path / "copy")
    assert json.loads((copy / "config.json").read_text()) == json.loads((nested / "config.json").read_text())
    assert (copy / "tokenizer.json").read_bytes() == (text / "tokenizer.json").read_bytes()
