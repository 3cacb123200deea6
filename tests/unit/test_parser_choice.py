"""The run's parsers: named as `vllm serve` names them, or found by rendering the model's chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.errors import ConfigError
from targets.parser_choice import (
    AUTO,
    REASONING_PARSERS,
    TOOL_PARSERS,
    chat_template_of,
    choose_parsers,
    recorded_parsers,
    resolve_auto,
)
from targets.template_probe import probe_template
from worker.tiny.families import TEMPLATES_DIR

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "templates"

#: Each template, published (tests/data/templates) or regen's own (the tiny models'), and what rendering it shows:
#: (family, reasoning parser, tool parser, thinking argument, thinking).
TEMPLATES = {
    PUBLISHED / "deepseek_r1.jinja": ("deepseek", "deepseek_r1", "deepseek_v3", None, "always"),
    PUBLISHED / "deepseek_v31.jinja": ("deepseek", "deepseek_v3", "deepseek_v31", "thinking", "switch"),
    PUBLISHED / "glm45.jinja": ("glm45", "glm45", "glm45", "enable_thinking", "switch"),
    PUBLISHED / "qwen3.jinja": ("qwen3", "qwen3", "hermes", "enable_thinking", "switch"),
    PUBLISHED / "llama31.jinja": ("llama3", None, "llama3_json", None, "never"),
    PUBLISHED / "kimi_k2_instruct.jinja": ("kimi", None, "kimi_k2", None, "never"),
    PUBLISHED / "kimi_k2_thinking.jinja": ("kimi", "kimi_k2", "kimi_k2", None, "always"),
    PUBLISHED / "mistral_small31.jinja": ("mistral", None, "mistral", None, "never"),
    PUBLISHED / "magistral_small2509.jinja": ("mistral", "mistral", "mistral", None, "always"),
    TEMPLATES_DIR / "deepseek_r1_chat.jinja": ("deepseek", "deepseek_r1", "deepseek_v3", None, "always"),
    TEMPLATES_DIR / "glm45_chat.jinja": ("glm45", "glm45", "glm45", "enable_thinking", "switch"),
    TEMPLATES_DIR / "llama3_chat.jinja": ("llama3", None, "llama3_json", None, "never"),
    TEMPLATES_DIR / "qwen3_chat.jinja": ("qwen3", "qwen3", "hermes", "enable_thinking", "switch"),
    TEMPLATES_DIR / "kimi_k2_chat.jinja": ("kimi", "kimi_k2", "kimi_k2", None, "always"),
    TEMPLATES_DIR / "mistral_chat.jinja": ("mistral", None, "mistral", None, "never"),
}


@pytest.mark.parametrize("path", sorted(TEMPLATES), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_template_is_placed_by_rendering_it(path):
    family, reasoning, tool, arg, thinking = TEMPLATES[path]
    found = probe_template(path.read_text())
    assert (found.family, found.reasoning, found.tool, found.thinking_arg, found.thinking) == TEMPLATES[path]
    choice = choose_parsers("/nowhere", template=path.read_text())
    assert (choice.reasoning, choice.tool, choice.chosen_by) == (reasoning, tool, f"template: {family}")
    for name in (choice.reasoning, choice.tool):
        assert name is None or name in REASONING_PARSERS | TOOL_PARSERS


def test_r1s_call_format_is_found_though_its_text_never_spells_it():
    """R1 builds ``function<｜tool▁sep｜>`` from tool['type']: a text search missed it and chose deepseek_v31."""
    template = (PUBLISHED / "deepseek_r1.jinja").read_text()
    assert "function<｜tool▁sep｜>" not in template
    assert probe_template(template).tool == "deepseek_v3"


def test_named_parsers_win_and_none_means_no_parser():
    choice = choose_parsers("/nowhere", reasoning="none", tool="llama3_json")
    assert (choice.reasoning, choice.tool, choice.chosen_by) == (None, "llama3_json", "named")
    assert choice.as_record() == {"reasoning_parser": "none", "tool_parser": "llama3_json"}
    # One name given: the other still comes from the template.
    half = choose_parsers("/nowhere", tool="qwen3_xml", template=(TEMPLATES_DIR / "qwen3_chat.jinja").read_text())
    assert (half.reasoning, half.tool, half.chosen_by) == ("qwen3", "qwen3_xml", "named and template: qwen3")


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"--tool-parser 'hermez' is not a parser vLLM knows; choices: none, .*hermes"):
        choose_parsers("/nowhere", reasoning="qwen3", tool="hermez")
    with pytest.raises(ConfigError, match="--reasoning-parser 'deepseek'"):
        choose_parsers("/nowhere", reasoning="deepseek", tool="hermes")


def test_a_template_of_no_known_format_asks_for_names(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}<custom>"}))
    with pytest.raises(ConfigError, match="no family regen knows.*--reasoning-parser.*qwen3.*--tool-parser.*hermes"):
        choose_parsers(str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no chat template regen can read"):
        choose_parsers(str(tmp_path / "empty"))


def test_a_model_not_readable_at_submit_is_left_to_the_workers_template():
    """A path that exists only on the GPU nodes, or a hub id: the workers choose, each row says what."""
    choice = choose_parsers("Qwen/Qwen3-8B", tool="hermes")
    assert (choice.reasoning, choice.tool, choice.chosen_by) == (AUTO, "hermes", "by the workers, from the template")
    assert choice.as_record() == {"reasoning_parser": "auto", "tool_parser": "hermes"}
    at_worker = resolve_auto(recorded_parsers(choice.as_record()), "Qwen/Qwen3-8B",
                             (TEMPLATES_DIR / "qwen3_chat.jinja").read_text())
    assert (at_worker.reasoning, at_worker.tool) == ("qwen3", "hermes")
    with pytest.raises(ConfigError, match="no family regen knows"):
        resolve_auto((AUTO, AUTO), "m", "{{ messages }}")


def test_the_template_is_read_from_where_models_keep_it(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "<|im_start|>"}]}))
    assert chat_template_of(tmp_path) == "<|im_start|>"
    # A separate file wins, as in transformers.
    (tmp_path / "chat_template.jinja").write_text((PUBLISHED / "glm45.jinja").read_text())
    assert choose_parsers(str(tmp_path)).tool == "glm45"


def test_a_run_recorded_before_parsers_were_named_is_read_as_auto():
    assert recorded_parsers({"temperature": 1.0}) == (AUTO, AUTO)
    assert recorded_parsers({"reasoning_parser": "none", "tool_parser": "hermes"}) == (None, "hermes")
    assert resolve_auto((None, "hermes"), "m", None).chosen_by == "named"
    assert resolve_auto((AUTO, AUTO), "m", (PUBLISHED / "glm45.jinja").read_text()).tool == "glm45"
