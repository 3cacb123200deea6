"""The engine args regen picks from a model's config: a hybrid's caching per platform, a vision tower left out."""

from __future__ import annotations

import json

from worker.engine.architecture_args import architecture_engine_args, is_hybrid, read_model_config
from worker.engine.host import chosen_engine_args

#: Qwen3.6-27B's published config, the fields read here (the rest changes nothing).
QWEN36_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 64,
                    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16},
    "vision_config": {"model_type": "qwen3_5", "depth": 27},
}
TINY_HYBRID = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
               "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
DENSE_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2}
GEMMA_SLIDING = {"architectures": ["Gemma3ForCausalLM"], "layer_types": ["sliding_attention", "full_attention"]}


def test_a_hybrid_on_the_cpu_build_drops_prefix_caching_which_would_need_chunked_prefill(tmp_path):
    assert architecture_engine_args(TINY_HYBRID, on_cpu=True) == {"enable_prefix_caching": False}
    (tmp_path / "config.json").write_text(json.dumps(TINY_HYBRID))
    chosen = chosen_engine_args(True, {}, str(tmp_path))
    # vLLM's rule: prefix caching on a hybrid needs chunked prefill, which regen's CPU args turn off.
    assert not (chosen["enable_prefix_caching"] and not chosen["enable_chunked_prefill"])


def test_a_hybrid_on_gpus_keeps_prefix_caching_with_vllms_chunked_prefill():
    assert architecture_engine_args(TINY_HYBRID, on_cpu=False) == {}


def test_the_published_27b_loads_its_language_model_only_on_every_platform():
    assert architecture_engine_args(QWEN36_27B, on_cpu=False) == {"language_model_only": True}
    assert architecture_engine_args(QWEN36_27B, on_cpu=True) == {"language_model_only": True,
                                                                 "enable_prefix_caching": False}


def test_dense_and_sliding_window_models_get_nothing_new():
    assert not is_hybrid(DENSE_QWEN3) and not is_hybrid(GEMMA_SLIDING)
    assert architecture_engine_args(DENSE_QWEN3, on_cpu=True) == {}
    assert architecture_engine_args(GEMMA_SLIDING, on_cpu=True) == {}
    assert architecture_engine_args(None, on_cpu=True) == {}


def test_the_model_folders_config_is_read_and_the_users_args_still_win(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_HYBRID))
    assert read_model_config(tmp_path) == TINY_HYBRID
    assert chosen_engine_args(True, {}, str(tmp_path))["enable_prefix_caching"] is False
    assert chosen_engine_args(True, {"enable_prefix_caching": True}, str(tmp_path))["enable_prefix_caching"] is True
    assert chosen_engine_args(True, {}, str(tmp_path / "missing"))["enable_prefix_caching"] is True
    assert read_model_config("Qwen/Qwen3.6-27B") is None  # a hub id: left to vLLM


def test_a_config_that_leaves_layer_types_to_transformers_is_a_hybrid_by_its_attention_interval():
    # transformers derives Qwen3-Next/3.5's layer_types from full_attention_interval where config.json omits them:
    # taken for dense, the CPU engine would be built with prefix caching and fail ("Chunked prefill is required").
    derived = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "num_hidden_layers": 64,
               "full_attention_interval": 4}
    assert is_hybrid(derived)
    assert architecture_engine_args(derived, on_cpu=True) == {"enable_prefix_caching": False}
    assert not is_hybrid({**derived, "full_attention_interval": 1})
