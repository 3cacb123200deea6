"""The tiny Magistral model: Tekken v13's tokens, mistral-common's template for Magistral, [THINK] training data
(no vLLM)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from targets.template_probe import probe_template
from worker.tiny import FAMILIES
from worker.tiny import family_model as fm
from worker.tiny.families import SPECS

SPEC = SPECS["magistral"]
PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "templates" / "magistral_small2509.jinja"
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
#: The card's system prompt opens every conversation without a system message of its own.
DEFAULT_SYSTEM = "<s>[SYSTEM_PROMPT]First draft your thinking process (inner monologue)"


@pytest.fixture(scope="module")
def tok():
    return fm.train_tokenizer(SPEC, fm.tokenizer_corpus(SPEC, 0))


def render(tok, messages, tools=None, **kwargs) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


def test_magistral_is_read_by_vllms_mistral_parsers_and_always_thinks():
    assert FAMILIES["magistral"] == {"reasoning_parser": "mistral", "tool_parser": "mistral"}
    found = probe_template(SPEC.template_path.read_text())
    assert (found.family, found.reasoning, found.tool, found.thinking, found.thinking_arg) == (
        SPEC.detected_as, "mistral", "mistral", "always", None)


def test_the_tiny_template_is_the_one_mistral_common_generates_for_magistral_byte_for_byte():
    assert SPEC.template_path.read_bytes() == PUBLISHED.read_bytes()


def test_v13_tokens_are_single_special_ids_and_args_makes_vllm_read_v11_calls(tok):
    for token in ("[THINK]", "[/THINK]", "[ARGS]", "[CALL_ID]", *SPEC.special_tokens):
        assert tok.encode(f"ab{token}cd", add_special_tokens=False).count(tok.convert_tokens_to_ids(token)) == 1
    text = "Hi [THINK]x[/THINK] y[TOOL_CALLS]f[ARGS]{} there"
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text
    # vLLM's mistral tool parser reads NAME[ARGS]{...} calls (tokenizer v11+) when the vocabulary has [ARGS].
    assert "[ARGS]" in tok.get_vocab()


def test_a_tool_step_renders_its_thought_calls_and_results_in_v13s_form(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call the tool.", "tool_calls": [
            {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "abcDEF124", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": '{"temp": 12}'},
        {"role": "tool", "tool_call_id": "abcDEF124", "content": '{"temp": 3}'},
    ]
    text = render(tok, messages, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert text == (
        f"<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][AVAILABLE_TOOLS]{json.dumps([WEATHER_TOOL])}[/AVAILABLE_TOOLS]"
        "[INST]Weather in Paris and Oslo?[/INST][THINK]Call the tool.[/THINK]"
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}</s>'
        '[TOOL_RESULTS]{"temp": 12}[/TOOL_RESULTS][TOOL_RESULTS]{"temp": 3}[/TOOL_RESULTS]')
    # Nothing switches thinking; without a system message of its own, the card's prompt asks for [THINK].
    plain = [{"role": "user", "content": "Hi"}]
    for flag in (True, False):
        assert render(tok, plain, add_generation_prompt=True, enable_thinking=flag) == \
            render(tok, plain, add_generation_prompt=True)
    assert render(tok, plain, add_generation_prompt=True).startswith(DEFAULT_SYSTEM)


def test_training_turns_open_with_a_thought_then_answer_or_call_and_end_the_turn(tok):
    rng = random.Random(0)
    calls = answers = defaulted = 0
    for _ in range(80):
        example = fm.family_example(SPEC, rng)
        ids, prompt_len = fm.render_example(SPEC, tok, example)
        prompt = render(tok, example.messages[:-1], tools=example.tools, add_generation_prompt=True)
        assert ids[:prompt_len] == tok.encode(prompt, add_special_tokens=False)
        assert prompt.endswith(("[/INST]", "[/TOOL_RESULTS]"))   # the model opens [THINK] itself
        assert ids[-1] == tok.convert_tokens_to_ids("</s>")
        completion = tok.decode(ids[prompt_len:], skip_special_tokens=False)
        last = example.messages[-1]
        assert completion.startswith("[THINK]" + last["reasoning_content"] + "[/THINK]"), completion
        if last.get("tool_calls"):
            written = "".join(f"[TOOL_CALLS]{c['function']['name']}[ARGS]{json.dumps(c['function']['arguments'])}"
                              for c in last["tool_calls"])
            assert completion.endswith(written + "</s>"), completion
            assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in last["tool_calls"])
            calls += 1
        else:
            assert completion.endswith(last["content"] + "</s>")
            answers += 1
        defaulted += prompt.startswith(DEFAULT_SYSTEM)
    assert calls and answers and defaulted


def test_a_random_build_loads_offline_and_carries_the_magistral_template(tmp_path):
    from transformers import AutoTokenizer

    out = fm.build_tiny_model(tmp_path / "m", family="magistral", variant="random", cache_dir=tmp_path / "cache")
    loaded = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert loaded.chat_template == PUBLISHED.read_text()
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == \
        loaded.convert_tokens_to_ids(["</s>"])
    ids = loaded.encode("x[THINK]y[/THINK]", add_special_tokens=False)
    assert loaded.decode(ids, skip_special_tokens=True) == "xy"
