"""Qwen3.6's published template with ``preserve_thinking`` on, off and mixed, over multi-turn tool conversations.

The template (tests/data/templates/qwen36.jinja) is swapped into the tiny Qwen3 tokenizer (the same special
tokens). A scripted model stands in for the engine and writes what Qwen3.6 writes: a thought (where the prompt
opened one), then ``qwen3_coder`` calls to a real user question, an answer after the results. The worker's own
path (worker/conversation/generation.py: generate_sample, its Renderer choosing parsers and keywords from the
template) regenerates each conversation; every prompt must then equal a fresh ``apply_chat_template`` with the
row's keywords, and earlier turns must carry the thoughts the model *regenerated* (never the source's) exactly
when ``preserve_thinking`` is on. No engine runs: the turns are the published format, not what a tiny model writes.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.fixtures.model import VLLM_HINT
from tests.support.fidelity import assert_prompts_are_fresh_renderings
from tests.support.helpers import require
from worker.conversation.dialogue import Generation

require("vllm", VLLM_HINT, module_level=True)

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "templates" / "qwen36.jinja"
CITIES = ("Paris", "Oslo", "Lima", "Kyiv", "Quito", "Perth")
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _conversation(n: int) -> dict:
    """Two user questions, each answered after a call (the second with two parallel calls), source thoughts marked."""
    first, second, third = CITIES[n % 6], CITIES[(n + 1) % 6], CITIES[(n + 2) % 6]

    def call(i: int, city: str) -> dict:
        return {"id": f"call_{n}_{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": city}}}

    messages = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": f"Weather in {first}?"},
        {"role": "assistant", "content": "", "reasoning_content": "SOURCE thought 1", "tool_calls": [call(0, first)]},
        {"role": "tool", "tool_call_id": f"call_{n}_0", "content": f'{{"city": "{first}", "temp": 12}}'},
        {"role": "assistant", "content": f"It is 12 in {first}.", "reasoning_content": "SOURCE thought 2"},
        {"role": "user", "content": f"And in {second} and {third}?"},
        {"role": "assistant", "content": "", "reasoning_content": "SOURCE thought 3",
         "tool_calls": [call(1, second), call(2, third)]},
        {"role": "tool", "tool_call_id": f"call_{n}_1", "content": f'{{"city": "{second}", "temp": 3}}'},
        {"role": "tool", "tool_call_id": f"call_{n}_2", "content": f'{{"city": "{third}", "temp": 20}}'},
        {"role": "assistant", "content": "Cold and warm.", "reasoning_content": "SOURCE thought 4"},
    ]
    return {"sample_id": f"qwen36-{n}", "messages": messages, "tools": WEATHER}


class ScriptedQwen36:
    """Answers ``generate(prompt_ids, params)`` as Qwen3.6 would: calls for the cities the last question names,
    an answer once the results are in. Each thought is new and numbered, so a later prompt shows whose it carries."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.thoughts = 0

    async def generate(self, prompt_ids: list[int], params: dict) -> Generation:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        last_turn = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "<tool_response>" in last_turn:
            body = "It is as the tools say."
        else:
            cities = re.findall(r"\b(" + "|".join(CITIES) + r")\b", last_turn)
            body = "".join(f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n"
                           f"</function>\n</tool_call>" + ("\n" if k < len(cities) - 1 else "")
                           for k, city in enumerate(cities))
        self.thoughts += 1
        # A prompt that opened the thought (thinking on) is continued inside it; one that closed it gets only the body.
        text = (f"regenerated thought {self.thoughts}\n</think>\n\n" if prompt.endswith("<think>\n") else "") + body
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end]
        return Generation(prompt_token_ids=list(prompt_ids), token_ids=ids, finish_reason="stop", stop_reason=self.end)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = TEMPLATE.read_text()
    return tokenizer


def _rows(tokenizer, *, preserve: str, thinking: str = "on", share: float = 0.5, count: int = 6) -> list[dict]:
    from worker.conversation.generation import generate_sample
    from worker.conversation.rendering import Renderer

    renderer = Renderer(tokenizer, 4096)
    engine = ScriptedQwen36(tokenizer)
    # As regen submit records a Qwen3.6 run it could not read (AUTO): the worker's template decides.
    sampling = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_tokens": 256, "seed": 3, "thinking": thinking,
                "thinking_off_share": 0.5 if thinking == "mix" else float(thinking == "off"),
                "reasoning_parser": "auto", "tool_parser": "auto", "thinking_arg": "auto", "history_arg": "auto",
                "preserve_thinking": preserve, "preserve_thinking_share": share}
    run = {"model": "qwen36", "provenance": {}, "sampling": sampling}

    async def all_rows():
        return [await generate_sample(engine, renderer, _conversation(n), run) for n in range(count)]

    return asyncio.run(all_rows())


def _last_prompt(tokenizer, row: dict) -> str:
    return tokenizer.decode(row["events"][-1]["prompt_token_ids"], skip_special_tokens=False)


@pytest.mark.parametrize("preserve", ["on", "off", "mix"])
def test_every_prompt_is_the_templates_rendering_with_the_rows_keywords(tokenizer, preserve):
    rows = _rows(tokenizer, preserve=preserve, thinking="mix")
    assert all(row["status"] == "done" and row["stop_reason"] is None for row in rows), rows[0]
    assert [row["turns"] for row in rows] == [4] * len(rows)   # call, answer, parallel calls, answer
    assert {row["parser"]["tool"] for row in rows} == {"qwen3_coder"}
    kept = [row["preserve_thinking"] for row in rows]
    assert set(kept) == {"on": {True}, "off": {False}, "mix": {True, False}}[preserve], kept
    assert assert_prompts_are_fresh_renderings(rows, tokenizer) == 4 * len(rows)   # 0 mismatches


def test_earlier_turns_carry_the_regenerated_thoughts_only_with_preserve_thinking_on(tokenizer):
    on, off = (_rows(tokenizer, preserve=mode, count=2) for mode in ("on", "off"))
    for row in on:
        prompt = _last_prompt(tokenizer, row)
        thoughts = [m["reasoning_content"] for m in row["messages"] if m["role"] == "assistant"]
        # The first question's call and answer, before the last real user query, keep their own thoughts.
        assert all(f"<think>\n{t}\n</think>" in prompt for t in thoughts[:3]), prompt
        assert "SOURCE" not in prompt
    for row in off:
        prompt = _last_prompt(tokenizer, row)
        thoughts = [m["reasoning_content"] for m in row["messages"] if m["role"] == "assistant"]
        assert not any(t in prompt for t in thoughts[:2]) and thoughts[2] in prompt   # the template's own rule
        assert "SOURCE" not in prompt


def test_the_probe_finds_preserve_thinking_and_that_the_template_drops_history_without_it():
    from targets.template_probe import probe_template

    found = probe_template(TEMPLATE.read_text())
    assert (found.family, found.tool, found.thinking_arg) == ("qwen3", "qwen3_coder", "enable_thinking")
    assert (found.history_arg, found.history_default) == ("preserve_thinking", False)
