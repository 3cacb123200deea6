"""The thinking switch of a run: the template's own argument, found by rendering; modes it cannot render refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.errors import ConfigError
from producer.run_config import build_run_config

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "templates"
OWN = Path(__file__).resolve().parents[2] / "worker" / "tiny" / "templates"


def _model(tmp_path: Path, template: Path) -> str:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template.read_text()}))
    return str(tmp_path)


def test_deepseek_v31_is_switched_by_its_thinking_argument_and_records_it(tmp_path):
    config = build_run_config(_model(tmp_path, PUBLISHED / "deepseek_v31.jinja"), max_tokens=8, thinking="mix")
    record = config.as_record()
    assert (record["thinking"], record["thinking_off_share"], record["thinking_arg"]) == ("mix", 0.5, "thinking")
    assert (record["reasoning_parser"], record["tool_parser"]) == ("deepseek_v3", "deepseek_v31")
    assert config.provenance()["thinking_arg"] == "thinking"


def test_glm_and_qwen_switch_with_enable_thinking(tmp_path):
    for name, template in (("glm", PUBLISHED / "glm45.jinja"), ("qwen", OWN / "qwen3_chat.jinja")):
        (tmp_path / name).mkdir()
        config = build_run_config(_model(tmp_path / name, template), max_tokens=8, thinking="off")
        assert (config.thinking, config.thinking_arg) == ("off", "enable_thinking")


def test_an_always_thinking_template_refuses_off_and_mix(tmp_path):
    model = _model(tmp_path, PUBLISHED / "deepseek_r1.jinja")
    for mode in ("off", "mix"):
        with pytest.raises(ConfigError, match=rf"--thinking {mode} cannot be rendered .* always thinks.*choose --thinking on"):
            build_run_config(model, max_tokens=8, thinking=mode)
    config = build_run_config(model, max_tokens=8)   # the default: what the template does
    assert (config.thinking, config.thinking_arg, config.parsers.tool) == ("on", "none", "deepseek_v3")


def test_a_template_that_never_thinks_refuses_on_and_defaults_to_off(tmp_path):
    model = _model(tmp_path, OWN / "llama3_chat.jinja")
    with pytest.raises(ConfigError, match=r"--thinking on cannot be rendered .* never thinks.*choose --thinking off"):
        build_run_config(model, max_tokens=8, thinking="on")
    config = build_run_config(model, max_tokens=8)
    assert (config.thinking, config.thinking_off_share, config.thinking_arg) == ("off", 1.0, "none")


def test_the_thinking_argument_is_no_part_of_the_config_hash(tmp_path):
    """It follows from the template (hashed in model_files): a run recorded before it was found keeps its hash."""
    config = build_run_config(_model(tmp_path, OWN / "qwen3_chat.jinja"), max_tokens=8)
    from dataclasses import replace

    assert replace(config, thinking_arg="auto").hash == config.hash
    assert replace(config, thinking="off").hash != config.hash


@pytest.mark.parametrize(("template", "parsers", "default", "refused"), [
    ("kimi_k2_thinking.jinja", ("kimi_k2", "kimi_k2"), "on", ("off", "mix")),
    ("kimi_k2_instruct.jinja", (None, "kimi_k2"), "off", ("on", "mix")),
    ("mistral_small31.jinja", (None, "mistral"), "off", ("on", "mix")),
    # Magistral: the model opens [THINK] itself, as its system prompt asks; no argument closes the thought.
    ("magistral_small2509.jinja", ("mistral", "mistral"), "on", ("off", "mix")),
])
def test_kimi_and_mistral_are_chosen_by_rendering_with_only_the_mode_they_render(tmp_path, template, parsers,
                                                                                 default, refused):
    """A plain submit records kimi_k2 / mistral; K2-Thinking and Magistral always think (the model opens the thought
    and no argument closes it), K2-Instruct and Mistral Small never do."""
    model = _model(tmp_path, PUBLISHED / template)
    config = build_run_config(model, max_tokens=8)
    assert (config.parsers.reasoning, config.parsers.tool) == parsers
    assert (config.thinking, config.thinking_arg) == (default, "none")
    for mode in refused:
        with pytest.raises(ConfigError, match=rf"--thinking {mode} cannot be rendered .*choose --thinking {default}"):
            build_run_config(model, max_tokens=8, thinking=mode)


#: A template of no family regen knows: a generation prompt no thinking argument changes.
UNKNOWN = ("{%- for m in messages -%}<|turn|>{{ m.role }}\n{{ m.content }}<|end|>{%- endfor -%}"
           "{%- if add_generation_prompt -%}<|turn|>assistant\n{%- endif -%}")
#: The same, switched by enable_thinking.
UNKNOWN_SWITCHED = UNKNOWN.replace("<|turn|>assistant\n{%- endif -%}",
                                   "<|turn|>assistant\n{%- if enable_thinking is false -%}<think></think>{%- endif -%}"
                                   "{%- endif -%}")


def _unknown(tmp_path: Path, template: str) -> str:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return str(tmp_path)


def test_named_parsers_on_a_template_without_a_switch_refuse_the_mode_it_cannot_render(tmp_path):
    """Off renders the same prompt as on: accepting it would file the thought as the answer, silently."""
    model = _unknown(tmp_path, UNKNOWN)
    for mode in ("off", "mix"):
        with pytest.raises(ConfigError, match=rf"--thinking {mode} cannot be rendered .*renders the same generation "
                                              r"prompt with thinking on and off.*choose --thinking on"):
            build_run_config(model, max_tokens=8, thinking=mode, reasoning_parser="qwen3", tool_parser="hermes")
    config = build_run_config(model, max_tokens=8, reasoning_parser="qwen3", tool_parser="hermes")
    assert (config.thinking, config.thinking_arg) == ("on", "none")
    # Without a reasoning parser the one mode is off.
    with pytest.raises(ConfigError, match=r"--thinking on cannot be rendered .*choose --thinking off"):
        build_run_config(model, max_tokens=8, thinking="on", reasoning_parser="none", tool_parser="hermes")
    assert build_run_config(model, max_tokens=8, reasoning_parser="none", tool_parser="hermes").thinking == "off"


def test_named_parsers_on_a_template_with_a_switch_take_every_mode_and_record_the_argument(tmp_path):
    model = _unknown(tmp_path, UNKNOWN_SWITCHED)
    config = build_run_config(model, max_tokens=8, thinking="off", reasoning_parser="qwen3", tool_parser="hermes")
    assert (config.thinking, config.thinking_arg) == ("off", "enable_thinking")
    assert build_run_config(model, max_tokens=8, thinking="mix", reasoning_parser="qwen3",
                            tool_parser="hermes").thinking_off_share == 0.5


@pytest.mark.parametrize(("template", "parsers"), [
    ("kimi_k2_thinking.jinja", ("kimi_k2", "kimi_k2")),
    ("magistral_small2509.jinja", ("mistral", "mistral")),
    ("deepseek_r1.jinja", ("deepseek_r1", "deepseek_v3")),
])
def test_naming_the_parsers_of_an_always_thinking_template_still_refuses_off_and_mix(tmp_path, template, parsers):
    """Named or found, a mode is accepted only where the template renders it: no argument closes these thoughts."""
    model = _model(tmp_path, PUBLISHED / template)
    for mode in ("off", "mix"):
        with pytest.raises(ConfigError, match=rf"--thinking {mode} cannot be rendered .*always thinks"):
            build_run_config(model, max_tokens=8, thinking=mode, reasoning_parser=parsers[0], tool_parser=parsers[1])
    named = build_run_config(model, max_tokens=8, reasoning_parser=parsers[0], tool_parser=parsers[1])
    assert (named.thinking, named.thinking_arg) == ("on", "none")
