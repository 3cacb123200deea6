"""The run's parsers: named as `vllm serve` names them, or read off the model's chat template."""

from __future__ import annotations

import json

import pytest

from ledger.errors import ConfigError
from ledger.parsers import (
    AUTO,
    REASONING_PARSERS,
    TOOL_PARSERS,
    chat_template_of,
    choose_parsers,
    recorded_parsers,
    resolve_auto,
)
from worker.tiny.model import TEMPLATE_PATH

# Excerpts of each family's published template: the markers that tell them apart.
TEMPLATES = {
    "qwen3": "<|im_start|>system\n<tools>{{ tools }}</tools><tool_call>\n{\"name\": ...}</tool_call><think>\n",
    "qwen3.5": "<|im_start|><tool_call>\n<function={{ name }}>\n<parameter={{ k }}>\n</parameter><think>",
    "qwen2.5": "<|im_start|>system\n<tool_call>\n{\"name\": ...}\n</tool_call>",
    "llama3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython<|eot_id|>",
    "deepseek_r1": "<｜User｜>{{ q }}<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                   "{{ name }}\n```json\n{{ args }}\n```<｜tool▁call▁end｜><think>\n",
    "deepseek_v31": "<｜User｜><｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ name }}<｜tool▁sep｜>{{ a }}",
    "glm45": "[gMASK]<sop><|system|><|user|><|assistant|><think></think><tool_call>{{ name }}\n<arg_key>k</arg_key>"
             "\n<arg_value>v</arg_value>\n</tool_call><|observation|>",
    "mistral": "[INST]{{ q }}[/INST][TOOL_CALLS][{\"name\": ...}]",
    "kimi_k2": "<|im_user|>user<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>",
}
EXPECTED = {
    "qwen3": ("qwen3", "hermes"), "qwen3.5": ("qwen3", "qwen3_coder"), "qwen2.5": (None, "hermes"),
    "llama3": (None, "llama3_json"), "deepseek_r1": ("deepseek_r1", "deepseek_v3"),
    "deepseek_v31": (None, "deepseek_v31"), "glm45": ("glm45", "glm45"), "mistral": (None, "mistral"),
    "kimi_k2": (None, "kimi_k2"),
}


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_each_family_is_read_off_its_template(family):
    choice = choose_parsers("/nowhere", template=TEMPLATES[family])
    assert (choice.reasoning, choice.tool) == EXPECTED[family]
    assert choice.chosen_by.startswith("template: ")
    for name in (choice.reasoning, choice.tool):
        assert name is None or name in REASONING_PARSERS | TOOL_PARSERS


def test_regens_own_tiny_template_is_qwen3_with_hermes_calls():
    choice = choose_parsers("/nowhere", template=TEMPLATE_PATH.read_text())
    assert (choice.reasoning, choice.tool, choice.chosen_by) == ("qwen3", "hermes", "template: qwen3")


def test_named_parsers_win_and_none_means_no_parser():
    choice = choose_parsers("/nowhere", reasoning="none", tool="llama3_json")
    assert (choice.reasoning, choice.tool, choice.chosen_by) == (None, "llama3_json", "named")
    assert choice.as_record() == {"reasoning_parser": "none", "tool_parser": "llama3_json"}
    # One name given: the other still comes from the template.
    half = choose_parsers("/nowhere", tool="qwen3_xml", template=TEMPLATES["qwen3"])
    assert (half.reasoning, half.tool, half.chosen_by) == ("qwen3", "qwen3_xml", "named and template: qwen3")


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"--tool-parser 'hermez' is not a parser vLLM knows; choices: none, .*hermes"):
        choose_parsers("/nowhere", reasoning="qwen3", tool="hermez")
    with pytest.raises(ConfigError, match="--reasoning-parser 'deepseek'"):
        choose_parsers("/nowhere", reasoning="deepseek", tool="hermes")


def test_a_template_of_no_known_family_asks_for_names(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}<custom>"}))
    with pytest.raises(ConfigError, match="no family regen knows.*--reasoning-parser.*qwen3.*--tool-parser.*hermes"):
        choose_parsers(str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no chat template regen can read"):
        choose_parsers(str(tmp_path / "empty"))


def test_a_model_not_readable_at_submit_is_left_to_the_workers_template(tmp_path):
    """A path that exists only on the GPU nodes, or a hub id: the workers choose, each row says what."""
    choice = choose_parsers("Qwen/Qwen3-8B", tool="hermes")
    assert (choice.reasoning, choice.tool, choice.chosen_by) == (AUTO, "hermes", "by the workers, from the template")
    assert choice.as_record() == {"reasoning_parser": "auto", "tool_parser": "hermes"}
    at_worker = resolve_auto(recorded_parsers(choice.as_record()), "Qwen/Qwen3-8B", TEMPLATES["qwen3.5"])
    assert (at_worker.reasoning, at_worker.tool) == ("qwen3", "hermes")
    with pytest.raises(ConfigError, match="no family regen knows.*choices|no family regen knows"):
        resolve_auto((AUTO, AUTO), "m", "{{ messages }}")


def test_the_template_is_read_from_where_models_keep_it(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "<|im_start|>"}]}))
    assert chat_template_of(tmp_path) == "<|im_start|>"
    (tmp_path / "chat_template.jinja").write_text(TEMPLATES["glm45"])   # a separate file wins, as in transformers
    assert choose_parsers(str(tmp_path)).tool == "glm45"


def test_a_run_recorded_before_parsers_were_named_is_read_as_auto():
    assert recorded_parsers({"temperature": 1.0}) == (AUTO, AUTO)
    assert recorded_parsers({"reasoning_parser": "none", "tool_parser": "hermes"}) == (None, "hermes")
    assert resolve_auto((None, "hermes"), "m", None).chosen_by == "named"
    assert resolve_auto((AUTO, AUTO), "m", TEMPLATES["glm45"]).tool == "glm45"
