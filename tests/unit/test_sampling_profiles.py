"""Sampling per thinking mode: generation_config.json for the mode it describes, the model card's for the other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.errors import ConfigError
from producer.run_config import build_run_config
from worker.conversation.generation import engine_sampling, mode_sampling

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "templates"
#: Qwen3.6-27B's generation_config.json sampling (its thinking mode's).
QWEN36_GENERATION = {"temperature": 1.0, "top_p": 0.95, "top_k": 20}
CORE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _model(tmp_path: Path, template: str = "qwen36.jinja", generation: dict | None = None) -> str:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": (PUBLISHED / template).read_text()}))
    (tmp_path / "generation_config.json").write_text(json.dumps(generation or QWEN36_GENERATION))
    return str(tmp_path)


def _core(values: dict) -> dict:
    return {k: values[k] for k in (*CORE, "presence_penalty") if k in values}


def test_qwen36_thinking_samples_with_its_generation_config_and_without_with_the_cards_values(tmp_path):
    model = _model(tmp_path)
    on = build_run_config(model, max_tokens=8, thinking="on").as_record()
    off = build_run_config(model, max_tokens=8, thinking="off").as_record()
    mix = build_run_config(model, max_tokens=8, thinking="mix").as_record()
    assert _core(on) == {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0}
    assert _core(off) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0,
                          "presence_penalty": 1.5}
    assert _core(mix) == _core(on) and mix["sampling_no_thinking"] == _core(off)
    assert "sampling_no_thinking" not in on and "sampling_no_thinking" not in off


def test_each_sample_samples_with_its_modes_profile_and_vllm_gets_the_penalty(tmp_path):
    record = build_run_config(_model(tmp_path), max_tokens=8, thinking="mix").as_record()
    thinking, plain = mode_sampling(record, True), mode_sampling(record, False)
    assert "sampling_no_thinking" not in thinking and "sampling_no_thinking" not in plain
    assert (thinking["temperature"], "presence_penalty" in thinking) == (1.0, False)
    assert (plain["temperature"], plain["presence_penalty"]) == (0.7, 1.5)
    assert plain["thinking"] == "mix" and plain["thinking_arg"] == "enable_thinking"   # the rest of the record
    params = engine_sampling(plain, seed=1, max_tokens=8)
    assert (params["presence_penalty"], params["temperature"], params["top_p"]) == (1.5, 0.7, 0.8)


def test_flags_go_over_both_profiles_and_each_profile_over_its_mode(tmp_path):
    config = build_run_config(_model(tmp_path), max_tokens=8, thinking="mix", temperature=0.5, presence_penalty=0.25,
                              frequency_penalty=0.1, sampling_thinking='{"temperature": 0.9}',
                              sampling_no_thinking='{"top_k": 40, "presence_penalty": 2.0}')
    record = config.as_record()
    assert (record["temperature"], record["presence_penalty"], record["frequency_penalty"]) == (0.9, 0.25, 0.1)
    other = record["sampling_no_thinking"]
    assert (other["temperature"], other["top_k"], other["presence_penalty"], other["frequency_penalty"]) == (
        0.5, 40, 2.0, 0.1)
    assert config.hash != build_run_config(_model(tmp_path), max_tokens=8, thinking="mix").hash


def test_a_run_that_sets_no_penalty_records_none_so_its_hash_is_what_it_was(tmp_path):
    own = Path(__file__).resolve().parents[2] / "worker" / "tiny" / "templates" / "qwen3_chat.jinja"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": own.read_text()}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    record = build_run_config(str(tmp_path), max_tokens=8, thinking="on").as_record()
    assert not {"presence_penalty", "frequency_penalty", "sampling_no_thinking"} & set(record)
    assert _core(record) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0}


def test_a_family_without_published_values_samples_both_modes_alike(tmp_path):
    model = _model(tmp_path, "glm45.jinja", {"temperature": 0.6, "top_p": 0.95})
    mix = build_run_config(model, max_tokens=8, thinking="mix").as_record()
    off = build_run_config(model, max_tokens=8, thinking="off").as_record()
    assert "sampling_no_thinking" not in mix and _core(off) == _core(mix)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("sampling_thinking", '{"temprature": 1}', r"--sampling-thinking: unknown sampling key\(s\) \['temprature'\]"),
    ("sampling_no_thinking", "[1]", "--sampling-no-thinking must be a JSON object"),
    ("sampling_no_thinking", '{"top_p": "high"}', "top_p must be a number"),
    ("sampling_thinking", "{oops", "--sampling-thinking must be a JSON object of sampling values"),
    ("presence_penalty", 3.0, "presence_penalty must be between -2 and 2"),
])
def test_bad_profiles_are_refused_naming_the_option_and_the_reason(tmp_path, option, value, message):
    with pytest.raises(ConfigError, match=message):
        build_run_config(_model(tmp_path), max_tokens=8, thinking="mix", **{option: value})
