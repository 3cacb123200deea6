"""The tiny kimi_k2 and mistral models: tokens, templates in Kimi's and Mistral's wire formats, training data (no vLLM)."""

from __future__ import annotations

import json
import random

import pytest

from targets.template_probe import probe_template
from worker.tiny import FAMILIES
from worker.tiny import family_model as fm
from worker.tiny.families import SPECS

NAMES = ("kimi_k2", "mistral")

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def agentic(first: str, second: str, *, named: bool = False) -> list[dict]:
    """A tool-using step, then a second question; calls with ids ``first`` and ``second``."""
    def result(call_id: str, content: str) -> dict:
        return {"role": "tool", "tool_call_id": call_id, "content": content, **({"name": "get_weather"} if named else {})}

    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call the tool.", "tool_calls": [
            {"id": first, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": second, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        result(first, '{"temp": 12}'), result(second, '{"temp": 3}'),
        {"role": "assistant", "content": "12 C in Paris.", "reasoning_content": "Both came back."},
        {"role": "user", "content": "Thanks. And Rome?"},
    ]


KIMI = agentic("functions.get_weather:0", "functions.get_weather:1")
MISTRAL = agentic("call00000", "call00001")


@pytest.fixture(scope="module")
def tokenizers():
    return {name: fm.train_tokenizer(SPECS[name], fm.tokenizer_corpus(SPECS[name], 0)) for name in NAMES}


def render(tok, messages, tools=None, **kwargs) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


def test_the_families_table_names_kimis_and_mistrals_vllm_parsers():
    assert FAMILIES["kimi_k2"] == {"reasoning_parser": "kimi_k2", "tool_parser": "kimi_k2"}
    assert FAMILIES["mistral"] == {"reasoning_parser": None, "tool_parser": "mistral"}


@pytest.mark.parametrize("family", NAMES)
def test_rendering_the_tiny_template_places_it_in_its_family(family):
    found = probe_template(SPECS[family].template_path.read_text())
    assert (found.reasoning, found.tool, found.thinking) == (
        SPECS[family].reasoning_parser, SPECS[family].tool_parser, SPECS[family].thinking)


@pytest.mark.parametrize("family", NAMES)
def test_special_and_format_tokens_are_single_ids_and_decoding_keeps_them_unless_asked(tokenizers, family):
    tok, spec = tokenizers[family], SPECS[family]
    for token in spec.all_tokens:
        assert tok.encode(f"ab{token}cd", add_special_tokens=False).count(tok.convert_tokens_to_ids(token)) == 1
    text = "Hi " + " ".join(spec.all_tokens) + " there"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    kept = tok.decode(ids, skip_special_tokens=True)
    assert not any(t in kept for t in spec.special_tokens) and all(t in kept for t in spec.format_tokens)
    # vLLM's mistral parser reads v3-v7 JSON calls only when the vocabulary has no [ARGS].
    assert "[ARGS]" not in tok.get_vocab()


def test_kimi_renders_the_tool_declaration_ids_as_call_headers_returns_and_thoughts(tokenizers):
    tok = tokenizers["kimi_k2"]
    text = render(tok, KIMI, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert text.startswith(f"<|im_system|>tool_declare<|im_middle|>{json.dumps([WEATHER_TOOL])}<|im_end|>"
                           "<|im_system|>system<|im_middle|>Be brief.<|im_end|>")
    assert text.split("Weather in Paris?<|im_end|>", 1)[1] == (
        "<|im_assistant|>assistant<|im_middle|><think>Call the tool.</think><|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
        '<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n{"temp": 12}<|im_end|>'
        '<|im_system|>tool<|im_middle|>## Return of functions.get_weather:1\n{"temp": 3}<|im_end|>'
        "<|im_assistant|>assistant<|im_middle|><think>Both came back.</think>12 C in Paris.<|im_end|>"
        "<|im_user|>user<|im_middle|>Thanks. And Rome?<|im_end|><|im_assistant|>assistant<|im_middle|>")
    # Nothing switches thinking: the prompt leaves the thought to the model.
    for flag in (True, False):
        assert render(tok, KIMI, tools=[WEATHER_TOOL], add_generation_prompt=True, enable_thinking=flag,
                      thinking=flag) == text
    # A result that carries a name is headed by it, not by "tool" (why regen leaves names off).
    named = render(tok, agentic("functions.get_weather:0", "functions.get_weather:1", named=True))
    assert "<|im_system|>get_weather<|im_middle|>## Return of" in named and "<|im_system|>tool<|im_middle|>" not in named
    # No system message: Kimi's default one.
    assert render(tok, [{"role": "user", "content": "Hi"}], add_generation_prompt=True) == (
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
        "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>")


def test_mistral_renders_tools_before_the_last_user_turn_json_calls_with_ids_and_results(tokenizers):
    tok = tokenizers["mistral"]
    text = render(tok, MISTRAL, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert text == (
        "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Weather in Paris?[/INST]"
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call00000"}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call00001"}]</s>'
        '[TOOL_RESULTS] {"content": {"temp": 12}, "call_id": "call00000"}[/TOOL_RESULTS]'
        '[TOOL_RESULTS] {"content": {"temp": 3}, "call_id": "call00001"}[/TOOL_RESULTS]'
        "12 C in Paris.</s>"
        f"[AVAILABLE_TOOLS] {json.dumps([WEATHER_TOOL])}[/AVAILABLE_TOOLS][INST]Thanks. And Rome?[/INST]")
    assert "Call the tool." not in text   # no thinking


@pytest.mark.parametrize("bad", ["call_0_0", "call_0", "call-0000", "call000000"])
def test_mistral_refuses_ids_that_are_not_nine_alphanumerics(tokenizers, bad):
    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match="Tool call IDs should be alphanumeric strings with length 9!"):
        render(tokenizers["mistral"], agentic(bad, "call00001"), tools=[WEATHER_TOOL])


@pytest.mark.parametrize("family", NAMES)
def test_training_examples_are_the_generation_prompt_then_the_turn_with_ids_in_the_familys_form(tokenizers, family):
    tok, spec = tokenizers[family], SPECS[family]
    rng = random.Random(0)
    calls = 0
    for _ in range(60):
        example = fm.family_example(spec, rng)
        ids, prompt_len = fm.render_example(spec, tok, example)
        prompt = render(tok, example.messages[:-1], tools=example.tools, add_generation_prompt=True,
                        enable_thinking=example.enable_thinking)
        assert ids[:prompt_len] == tok.encode(prompt, add_special_tokens=False)
        assert ids[-1] == tok.convert_tokens_to_ids(spec.turn_end(example.messages[-1]))
        completion = tok.decode(ids[prompt_len:])
        assert completion.startswith("<think>") == (family == "kimi_k2")
        for message in example.messages:
            for call in message.get("tool_calls") or []:
                calls += 1
                if family == "kimi_k2":
                    assert call["id"] == f"functions.{call['function']['name']}:{call['id'].rsplit(':', 1)[1]}"
                else:
                    assert len(call["id"]) == 9 and call["id"].isalnum()
            if message["role"] == "tool":
                assert message["tool_call_id"] and ("name" in message) == (family != "kimi_k2")
    assert calls


@pytest.mark.parametrize("family", NAMES)
def test_a_random_build_loads_offline_and_carries_its_template(tmp_path, family):
    from transformers import AutoTokenizer

    out = fm.build_tiny_model(tmp_path / family, family=family, variant="random", cache_dir=tmp_path / "cache")
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == SPECS[family].template_path.read_text()
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == \
        tok.convert_tokens_to_ids(list(SPECS[family].stop_tokens))
