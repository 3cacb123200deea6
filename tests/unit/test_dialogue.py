"""On-policy multi-turn regeneration of one conversation, with a scripted engine.

The engine is a fake (no GPU here): ``generate`` plays back a script of texts per turn
and ``render`` records every context it is given. The real engine is exercised by the
worker's integration tests.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from worker.conversation.dialogue import Generation, SampleError, regenerate_conversation

THINK_END_ID = 7


def fake_ids(text: str) -> list[int]:
    """One id per whitespace-separated piece; ``</think>`` is its own id, as in Qwen3's vocabulary."""
    return [
        THINK_END_ID if piece == "</think>" else 100 + len(piece)
        for piece in re.findall(r"</think>|\S+", text)
    ]


class Engine:
    """``render`` and ``generate`` over a script: turn index -> text or (text, finish_reason)."""

    def __init__(self, script: dict[int, str | tuple[str, str]]):
        self.script = script
        self.contexts: list[list[dict]] = []
        self.tools_seen: list[list[dict] | None] = []
        self.rendered: list[list[int]] = []
        self.turns: list[int] = []

    def render(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        self.contexts.append([dict(m) for m in messages])
        self.tools_seen.append(tools)
        ids = list(range(10 * len(messages)))  # length encodes the context size
        self.rendered.append(ids)
        return ids

    async def generate(self, prompt_ids: list[int], turn: int) -> Generation:
        self.turns.append(turn)
        entry = self.script[turn]
        text, finish = (entry, "stop") if isinstance(entry, str) else entry
        return Generation(
            prompt_token_ids=list(prompt_ids), token_ids=fake_ids(text), text=text, finish_reason=finish
        )


def run(sample: dict, engine: Engine, *, thinking: bool = True, **kwargs):
    return asyncio.run(
        regenerate_conversation(
            sample, thinking=thinking, render=engine.render, generate=engine.generate, **kwargs
        )
    )


def call(name: str, arguments: dict | None = None) -> str:
    body = json.dumps({"name": name, "arguments": arguments or {}})
    return f"<tool_call>\n{body}\n</tool_call>"


def src_call(name: str, **extra) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": {}}, **extra}


USER = {"role": "user", "content": "What is 2+2?"}
SYSTEM = {"role": "system", "content": "Be brief."}


# --- turns and contexts ---------------------------------------------------------------------


def test_single_turn_conversation_gets_one_regenerated_answer():
    engine = Engine({0: "<think>\nadd\n</think>\n\n4."})
    result = run({"messages": [SYSTEM, USER, {"role": "assistant", "content": "SOURCE says 5"}]}, engine)
    assert result.messages == [
        SYSTEM,
        USER,
        {"role": "assistant", "content": "4.", "reasoning_content": "add"},
    ]
    assert result.stop_reason is None and result.stop_code is None
    assert (result.turns, result.finish_reason, result.tool_calls) == (1, "stop", 0)
    assert engine.contexts == [[SYSTEM, USER]]


def test_later_turns_are_conditioned_on_the_models_own_earlier_answers():
    sample = {
        "messages": [
            SYSTEM,
            USER,
            {"role": "assistant", "content": "SOURCE-ANSWER-1", "reasoning_content": "SOURCE-THOUGHT"},
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "SOURCE-ANSWER-2"},
        ]
    }
    engine = Engine({0: "<think>\nr1\n</think>\n\nFour.", 1: "<think>\nr2\n</think>\n\nSix."})
    result = run(sample, engine)

    second_context = engine.contexts[1]
    assert second_context[2] == {"role": "assistant", "content": "Four.", "reasoning_content": "r1"}
    assert "SOURCE" not in json.dumps(engine.contexts)
    assert [m["content"] for m in result.messages] == [
        "Be brief.",
        "What is 2+2?",
        "Four.",
        "And 3+3?",
        "Six.",
    ]
    assert engine.turns == [0, 1]
    assert [e["turn"] for e in result.events] == [0, 1]
    assert [e["message_index"] for e in result.events] == [2, 4]


def test_conversation_ending_on_a_user_message_gets_a_final_answer():
    engine = Engine({0: "<think>\n\n</think>\n\nHi."})
    result = run({"messages": [USER]}, engine)
    assert result.messages[-1] == {"role": "assistant", "content": "Hi.", "reasoning_content": ""}
    assert result.turns == 1


def test_non_thinking_turn_is_all_content():
    engine = Engine({0: "Four."})
    result = run({"messages": [USER]}, engine, thinking=False, think_end_id=THINK_END_ID)
    assert result.messages[-1] == {"role": "assistant", "content": "Four.", "reasoning_content": None}
    assert (result.reasoning_tokens, result.answer_tokens) == (0, 1)


def test_tools_are_passed_to_every_render():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    engine = Engine({0: "ok"})
    run({"messages": [USER], "tools": tools}, engine, thinking=False)
    assert engine.tools_seen == [tools]


def test_engine_end_of_turn_text_does_not_end_up_in_content():
    engine = Engine({0: "Four.<|im_end|><|endoftext|>"})
    result = run({"messages": [USER]}, engine, thinking=False)
    assert result.messages[-1]["content"] == "Four."


# --- events ----------------------------------------------------------------------------------


def test_loss_mask_covers_exactly_the_completion_ids():
    engine = Engine({0: "<think>\na b c\n</think>\n\nd e", 1: "<think>\nf\n</think>\n\ng"})
    sample = {"messages": [USER, {"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]}
    result = run(sample, engine, think_end_id=THINK_END_ID)
    for event, rendered in zip(result.events, engine.rendered, strict=True):
        prompt, completion, mask = (
            event["prompt_token_ids"],
            event["completion_token_ids"],
            event["loss_mask"],
        )
        assert prompt == rendered
        assert len(mask) == len(prompt) + len(completion)
        assert mask[: len(prompt)] == [0] * len(prompt)
        assert mask[len(prompt) :] == [1] * len(completion)
        assert event["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(completion)}
    assert result.prompt_tokens == 10 + 30
    assert result.completion_tokens == sum(len(e["completion_token_ids"]) for e in result.events)


def test_reasoning_and_answer_tokens_are_counted_on_ids_around_think_end():
    engine = Engine({0: "<think>\na b c\n</think>\n\nd e"})
    result = run({"messages": [USER]}, engine, think_end_id=THINK_END_ID)
    event = result.events[0]
    # ids: <think> a b c | </think> | d e
    assert (event["reasoning_tokens"], event["answer_tokens"]) == (4, 2)
    assert (result.reasoning_tokens, result.answer_tokens) == (4, 2)


def test_token_split_counts_are_none_without_the_think_end_id():
    result = run({"messages": [USER]}, Engine({0: "<think>\na\n</think>\n\nb"}))
    assert result.events[0]["reasoning_tokens"] is None
    assert (result.reasoning_tokens, result.answer_tokens) == (None, None)


# --- truncation, abort, max_turns --------------------------------------------------------------


def test_truncation_inside_reasoning_stops_and_leaks_no_thought_into_content():
    sample = {"messages": [USER, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]}
    engine = Engine({0: ("<think>\nhalf a secret thou", "length")})
    result = run(sample, engine, think_end_id=THINK_END_ID)
    assert result.stop_reason == "truncated"
    assert result.messages[-1] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "half a secret thou",
    }
    event = result.events[0]
    assert event["truncated_in_reasoning"] and event["finish_reason"] == "length"
    # ids: <think> half a secret thou; all of it is thought
    assert (event["reasoning_tokens"], event["answer_tokens"]) == (5, 0)
    assert engine.turns == [0]
    assert result.finish_reason == "length"


def test_truncated_answer_stops_the_conversation_and_is_kept():
    sample = {"messages": [USER, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]}
    engine = Engine({0: ("<think>\nr\n</think>\n\nThe answer is", "length")})
    result = run(sample, engine)
    assert result.stop_reason == "truncated"
    assert result.messages[-1]["content"] == "The answer is"
    assert not result.events[0]["truncated_in_reasoning"]
    assert engine.turns == [0]


def test_aborted_generation_stops_the_conversation():
    result = run({"messages": [USER]}, Engine({0: ("partial", "abort")}), thinking=False)
    assert result.stop_reason == "aborted"


def test_max_turns_stops_before_generating_more():
    messages = [USER]
    for n in range(4):
        messages += [{"role": "assistant", "content": f"a{n}"}, {"role": "user", "content": f"u{n}"}]
    engine = Engine({n: f"answer {n}" for n in range(5)})
    result = run({"messages": messages}, engine, thinking=False, max_turns=2)
    assert result.stop_reason == "max_turns"
    assert engine.turns == [0, 1]
    assert result.turns == 2


# --- tool calls --------------------------------------------------------------------------------


def tool_conversation(source_calls: list[str], results: list[dict], then: str = "Sunny, 9 am.") -> dict:
    return {
        "messages": [
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [src_call(n) for n in source_calls]},
            *results,
            {"role": "assistant", "content": then},
        ]
    }


WEATHER = {"role": "tool", "name": "get_weather", "content": '{"sky": "sunny"}'}
TIME = {"role": "tool", "name": "get_time", "content": '{"time": "09:00"}'}


def test_parallel_tool_calls_get_the_source_results_spliced_with_the_new_ids():
    engine = Engine({0: f"<think>\nr\n</think>\n\n{call('get_weather')}\n{call('get_time')}", 1: "Sunny."})
    result = run(tool_conversation(["get_weather", "get_time"], [WEATHER, TIME]), engine)

    assert result.stop_reason is None
    calls = result.messages[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_0_0", "call_0_1"]
    assert result.messages[2] == {**WEATHER, "tool_call_id": "call_0_0", "name": "get_weather"}
    assert result.messages[3] == {**TIME, "tool_call_id": "call_0_1", "name": "get_time"}
    assert engine.contexts[1] == result.messages[:4]
    assert result.events[0]["is_tool_call"] and not result.events[1]["is_tool_call"]
    assert result.tool_calls == 2


def test_parallel_calls_in_another_order_get_their_results_reordered():
    engine = Engine({0: f"{call('get_time')}\n{call('get_weather')}", 1: "Sunny."})
    result = run(tool_conversation(["get_weather", "get_time"], [WEATHER, TIME]), engine, thinking=False)
    assert result.stop_reason is None
    assert [(m["name"], m["tool_call_id"], m["content"]) for m in result.messages[2:4]] == [
        ("get_time", "call_0_0", TIME["content"]),
        ("get_weather", "call_0_1", WEATHER["content"]),
    ]


def test_results_are_matched_to_source_calls_by_id_when_the_source_has_ids():
    sample = {
        "messages": [
            USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [src_call("f", id="s1"), src_call("f", id="s2")],
            },
            {"role": "tool", "tool_call_id": "s2", "content": "second"},
            {"role": "tool", "tool_call_id": "s1", "content": "first"},
            {"role": "assistant", "content": "done"},
        ]
    }
    engine = Engine({0: f"{call('f', {'n': 1})}\n{call('f', {'n': 2})}", 1: "ok"})
    result = run(sample, engine, thinking=False)
    assert [(m["tool_call_id"], m["content"]) for m in result.messages[2:4]] == [
        ("call_0_0", "first"),
        ("call_0_1", "second"),
    ]


def test_tool_call_ids_are_unique_across_turns():
    sample = {
        "messages": [
            USER,
            {"role": "assistant", "content": "", "tool_calls": [src_call("get_weather")]},
            WEATHER,
            {"role": "assistant", "content": "", "tool_calls": [src_call("get_time")]},
            TIME,
            {"role": "assistant", "content": "done"},
        ]
    }
    engine = Engine({0: call("get_weather"), 1: call("get_time"), 2: "Sunny at nine."})
    result = run(sample, engine, thinking=False)
    assert result.stop_reason is None
    ids = [m["tool_call_id"] for m in result.messages if m["role"] == "tool"]
    assert ids == ["call_0_0", "call_1_0"]


def test_conversation_ending_on_tool_results_gets_a_final_answer():
    sample = tool_conversation(["get_weather"], [WEATHER])
    sample["messages"].pop()  # ends on the tool result
    engine = Engine({0: call("get_weather"), 1: "Sunny."})
    result = run(sample, engine, thinking=False)
    assert result.messages[-1]["content"] == "Sunny."
    assert engine.contexts[1][-1]["role"] == "tool"
    assert result.stop_reason is None


@pytest.mark.parametrize(
    ("source_calls", "results", "generated", "stop_reason"),
    [
        (
            ["get_weather"],
            [WEATHER],
            call("get_time"),
            "tool_calls_diverged: expected [get_weather] got [get_time]",
        ),
        (
            ["get_weather", "get_time"],
            [WEATHER, TIME],
            call("get_weather"),
            "tool_calls_diverged: expected [get_weather,get_time] got [get_weather]",
        ),
        (
            ["get_weather"],
            [WEATHER],
            "It is sunny, I guess.",
            "tool_calls_diverged: expected [get_weather] got []",
        ),
        ([], [], call("get_weather"), "tool_calls_diverged: expected [] got [get_weather]"),
        (["get_weather"], [], call("get_weather"), "tool_results_missing: no result for [get_weather]"),
        (
            ["get_weather"],
            [WEATHER, TIME],
            call("get_weather"),
            "tool_results_unmatched: result get_time answers no call",
        ),
    ],
    ids=["name", "count", "no-call", "extra-call", "missing-result", "unmatched-result"],
)
def test_diverging_tool_calls_stop_the_conversation_and_keep_the_diverging_turn(
    source_calls, results, generated, stop_reason
):
    sample = tool_conversation(source_calls, results)
    if not source_calls:  # a plain answer in the source, then the user goes on
        sample["messages"][1] = {"role": "assistant", "content": "SOURCE"}
        sample["messages"].insert(2, {"role": "user", "content": "thanks"})
    engine = Engine({0: generated, 1: "must not be generated"})
    result = run(sample, engine, thinking=False)

    assert result.stop_reason == stop_reason
    assert result.stop_code == stop_reason.split(":")[0]
    assert engine.turns == [0]
    assert result.messages[-1]["role"] == "assistant"
    assert len(result.messages) == 2
    assert result.events[0]["is_tool_call"] == ("<tool_call>" in generated)


def test_invalid_tool_call_json_stops_and_keeps_the_turn_as_generated():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}}\n</tool_call>'
    engine = Engine({0: "Checking.\n" + bad, 1: "must not be generated"})
    result = run(tool_conversation(["get_weather"], [WEATHER]), engine, thinking=False)

    assert result.stop_code == "tool_call_invalid"
    assert result.stop_reason.startswith("tool_call_invalid: invalid JSON")
    assert result.messages[-1] == {
        "role": "assistant",
        "content": "Checking.\n" + bad,
        "reasoning_content": None,
    }
    assert result.events[0]["tool_call_errors"][0]["raw"] == bad
    assert engine.turns == [0]


def test_a_call_to_a_tool_the_sample_did_not_offer_stops_with_its_own_reason():
    sample = {**tool_conversation(["get_weather"], [WEATHER]),
              "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]}
    engine = Engine({0: call("read_file", {"path": "/etc/passwd"}), 1: "must not be generated"})
    result = run(sample, engine, thinking=False)
    assert result.stop_reason == "tool_not_offered: read_file"
    assert result.messages[-1]["tool_calls"][0]["function"]["name"] == "read_file"  # kept, as generated
    assert engine.turns == [0]
    # An offered tool the source called goes on as before.
    ok = run(sample, Engine({0: call("get_weather"), 1: "Sunny."}), thinking=False)
    assert ok.stop_reason is None and ok.messages[2]["role"] == "tool"


def test_a_different_call_on_the_last_source_turn_is_not_a_divergence():
    # Nothing follows the turn, so no cached result is needed: the conversation is complete.
    sample = {
        "messages": [USER, {"role": "assistant", "content": "", "tool_calls": [src_call("get_weather")]}]
    }
    result = run(sample, Engine({0: "Four."}), thinking=False)
    assert result.stop_reason is None
    assert result.messages[-1]["content"] == "Four."


# --- errors --------------------------------------------------------------------------------


def test_a_render_failure_on_the_first_turn_is_a_sample_error():
    def broken_render(messages, tools):
        raise ValueError("unknown role in template")

    engine = Engine({0: "x"})
    with pytest.raises(SampleError) as info:
        asyncio.run(
            regenerate_conversation(
                {"messages": [USER]}, thinking=True, render=broken_render, generate=engine.generate
            )
        )
    assert info.value.reason == "template_error"
    assert "unknown role in template" in info.value.detail
    assert info.value.turn == 0
    assert isinstance(info.value.__cause__, ValueError)
    assert engine.turns == []


def test_a_sample_error_on_a_later_turn_stops_and_keeps_earlier_turns():
    engine = Engine({0: "Four."})

    def render(messages, tools):
        if len(messages) > 2:
            raise SampleError("prompt_too_long", "prompt has 9 tokens; the model's context is 8")
        return engine.render(messages, tools)

    sample = {"messages": [USER, {"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]}
    result = asyncio.run(
        regenerate_conversation(sample, thinking=False, render=render, generate=engine.generate)
    )
    assert result.stop_reason == "prompt_too_long: prompt has 9 tokens; the model's context is 8"
    assert result.stop_code == "prompt_too_long"
    assert result.turns == 1
    assert result.messages[-1] == {"role": "user", "content": "more"}


def test_engine_failures_propagate_unchanged():
    async def dead_engine(prompt_ids, turn):
        raise RuntimeError("engine core died")

    with pytest.raises(RuntimeError, match="engine core died"):
        asyncio.run(
            regenerate_conversation(
                {"messages": [USER]}, thinking=True, render=Engine({}).render, generate=dead_engine
            )
        )


@pytest.mark.parametrize(
    "sample",
    [{"messages": []}, {"messages": [{"role": "narrator", "content": "x"}]}, {"messages": [SYSTEM]}],
    ids=["empty", "unknown-role", "nothing-to-answer"],
)
def test_malformed_samples_are_sample_errors(sample):
    with pytest.raises(SampleError) as info:
        run(sample, Engine({0: "x"}))
    assert info.value.reason == "invalid_sample"


# --- issue 33: names as the source has them, ids the template demands, parsers that raise --------


def test_a_spliced_result_carries_a_name_only_where_the_source_result_has_one():
    """As an OpenAI request carries tool messages: Kimi's template writes a name in place of the role."""
    unnamed = {"role": "tool", "content": '{"sky": "sunny"}'}
    engine = Engine({0: call("get_weather"), 1: "Sunny."})
    result = run(tool_conversation(["get_weather"], [unnamed]), engine, thinking=False)
    assert result.messages[2] == {**unnamed, "tool_call_id": "call_0_0"}
    engine = Engine({0: call("get_weather"), 1: "Sunny."})
    result = run(tool_conversation(["get_weather"], [WEATHER]), engine, thinking=False)
    assert result.messages[2] == {**WEATHER, "tool_call_id": "call_0_0"}


class AlnumIdParser:
    """regen's Qwen parser under Mistral's id rule (targets/call_ids.py), as VllmTurnParser(tool="mistral") is."""

    call_id_rule = "alnum9"

    def __init__(self):
        from targets.turn_parsers import RegenQwenParser

        self._inner = RegenQwenParser()
        self.description = {"reasoning": None, "tool": "mistral", "by": "test"}
        self.think_end_id = None

    def thinking_after(self, prompt_ids, thinking):
        return thinking

    def parse(self, generation, **kwargs):
        return self._inner.parse(generation, **kwargs)


def test_ids_a_template_refuses_become_the_sources_own_where_valid_else_derived_from_sample_turn_and_call():
    from targets.call_ids import derived_id

    sample = {"sample_id": "s-1", "messages": [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [src_call("f", id="abcDEF123"), src_call("g", id="call_x")]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "F"},
        {"role": "tool", "tool_call_id": "call_x", "content": "G"},
        {"role": "assistant", "content": "done"},
    ]}
    engine = Engine({0: f"{call('g')}\n{call('f')}", 1: "ok"})
    result = run(sample, engine, thinking=False, parser=AlnumIdParser())
    ids = [c["id"] for c in result.messages[1]["tool_calls"]]
    assert ids == [derived_id("s-1", 0, 0), "abcDEF123"]
    assert all(len(i) == 9 and i.isalnum() for i in ids)
    assert [(m["tool_call_id"], m["content"]) for m in result.messages[2:4]] == [(ids[0], "G"), (ids[1], "F")]
    # The same on a retry: nothing random.
    again = run(sample, Engine({0: f"{call('g')}\n{call('f')}", 1: "ok"}), thinking=False, parser=AlnumIdParser())
    assert again.messages == result.messages


class RaisingParser(AlnumIdParser):
    def __init__(self, on_turn: int):
        super().__init__()
        self.on_turn = on_turn
        self.description = {"reasoning": "openai_gptoss", "tool": "openai", "by": "vllm test"}

    def parse(self, generation, *, turn, **kwargs):
        if turn == self.on_turn:
            raise NotImplementedError("GptOssReasoningParser only provides boundary detection")
        return super().parse(generation, turn=turn, **kwargs)


@pytest.mark.parametrize("turn", [0, 1])
def test_a_parser_that_raises_fails_that_sample_with_the_parsers_name_and_the_reason(turn):
    sample = {"messages": [USER, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}
    with pytest.raises(SampleError) as caught:
        run(sample, Engine({0: "4.", 1: "5."}), thinking=False, parser=RaisingParser(turn))
    assert caught.value.reason == "parser_error" and caught.value.turn == turn
    assert "reasoning openai_gptoss, tool openai" in caught.value.detail
    assert "NotImplementedError: GptOssReasoningParser only provides boundary detection" in caught.value.detail
