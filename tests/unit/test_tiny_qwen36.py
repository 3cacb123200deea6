"""The tiny Qwen3.6 family: Qwen3.6-27B's published template byte for byte, on Qwen3.5's hybrid architecture."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from worker.engine.architecture_args import architecture_engine_args, is_hybrid
from worker.tiny import family_model as fm
from worker.tiny.families import SPECS

SPEC = SPECS["qwen36"]
PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "templates" / "qwen36.jinja"
#: What Qwen3.6 does otherwise than Qwen3: its template, tool parser and card, its hybrid decoder, and the family
#: ``regen submit`` reads its template as. Every other field, its tokenizer's tokens above all, is Qwen3's.
OWN = ("name", "template", "tool_parser", "sampling", "detected_as", "architecture")


@pytest.fixture(scope="module")
def tokenizer():
    return fm.train_tokenizer(SPEC, fm.tokenizer_corpus(SPEC, 0))


def test_its_template_is_qwen36s_published_one():
    assert SPEC.template_path.read_bytes() == PUBLISHED.read_bytes()
    assert (SPEC.reasoning_parser, SPEC.tool_parser) == ("qwen3", "qwen3_coder")


def test_it_has_qwen3s_tokens_turn_ends_and_stops_and_differs_from_qwen3_only_in_its_own_fields():
    assert replace(SPECS["qwen3"], **{name: getattr(SPEC, name) for name in OWN}) == SPEC


def test_its_decoder_is_a_hybrid_that_regen_builds_engines_for_as_one(tokenizer):
    config = fm.model_config(SPEC, tokenizer).to_dict()
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert config["layer_types"] == ["linear_attention", "full_attention"]
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert is_hybrid(config) and architecture_engine_args(config, on_cpu=True) == {"enable_prefix_caching": False}


def test_training_turns_think_or_not_and_call_tools_in_qwen3_coder_xml(tokenizer):
    rng = random.Random(0)
    seen = {"thinking": 0, "not thinking": 0, "call": 0}
    for _ in range(60):
        example = fm.family_example(SPEC, rng)
        prompt, completion = fm.completion_text(SPEC, tokenizer, example)
        assert completion.endswith("<|im_end|>")
        if example.enable_thinking:
            assert prompt.endswith("<|im_start|>assistant\n<think>\n") and "\n</think>\n\n" in completion
            seen["thinking"] += 1
        else:
            assert prompt.endswith("<think>\n\n</think>\n\n") and "<think>" not in completion
            seen["not thinking"] += 1
        if example.messages[-1].get("tool_calls"):
            name = example.messages[-1]["tool_calls"][0]["function"]["name"]
            assert f"<tool_call>\n<function={name}>\n<parameter=" in completion
            seen["call"] += 1
    assert all(seen.values()), seen
