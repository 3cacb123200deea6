"""Quality classes of hand-built output rows (the shape worker/conversation/generation.py writes) and the gate's maths."""

from __future__ import annotations

import random

import pytest

from ledger.errors import ConfigError
from ledger.quality import (
    BAD_CLASSES,
    CLASSES,
    DEFAULT_GATE,
    Quality,
    Thresholds,
    classify_sample,
    judge,
    repetition_share,
    worst,
)

T = Thresholds()
THINK_END = 7  # a stand-in for the </think> id in these hand-built completions


def words(n: int, seed: int = 0) -> list[int]:
    """n token ids that do not repeat n-grams (like prose)."""
    rng = random.Random(seed)
    return [rng.randrange(100, 50_000) for _ in range(n)]


def turn(*, reasoning: str | None = "Let me think about it.", content: str = "Paris is the capital of France.",
         reasoning_ids: int = 20, answer_ids: int = 12, finish: str = "stop", tool_calls=None, tool_errors=(),
         think_tags_ok: bool = True, truncated_in_reasoning: bool = False, completion=None, thinking: bool = True):
    """One (assistant message, event) pair shaped like worker/conversation/dialogue.py writes them."""
    if completion is None:
        completion = (words(reasoning_ids, 1) + [THINK_END] if thinking else []) + words(answer_ids, 2)
    message = {"role": "assistant", "reasoning_content": reasoning if thinking else None, "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    event = {
        "turn": 0, "message_index": 0, "prompt_token_ids": [1, 2, 3], "completion_token_ids": completion,
        "loss_mask": [0, 0, 0] + [1] * len(completion), "finish_reason": finish, "engine_stop_reason": None,
        "is_tool_call": bool(tool_calls or tool_errors),
        "reasoning_tokens": reasoning_ids if thinking else 0, "answer_tokens": answer_ids,
        "usage": {"prompt_tokens": 3, "completion_tokens": len(completion)},
        "tool_call_errors": list(tool_errors), "truncated_in_reasoning": truncated_in_reasoning,
        "think_tags_ok": think_tags_ok,
    }
    return message, event


def sample(*turns, thinking: bool = True, status: str = "done") -> dict:
    messages: list[dict] = [{"role": "user", "content": "What is the capital of France?"}]
    events = []
    for n, (message, event) in enumerate(turns):
        messages.append(message)
        events.append({**event, "turn": n, "message_index": len(messages) - 1})
        if message.get("tool_calls"):
            messages.append({"role": "tool", "content": "{}", "tool_call_id": "call_0_0", "name": "f"})
    return {"sample_id": "s", "status": status, "thinking": thinking, "messages": messages, "events": events,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]}


CALL = [{"id": "call_0_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]


def test_a_normal_thinking_answer_is_ok():
    quality, details = classify_sample(sample(turn()), T)
    assert quality == "ok"
    assert details == [{"turn": 0, "quality": "ok", "flags": [], "repetition_share": 0.0}]


def test_the_think_ok_stub_that_ruined_a_run_is_a_stub_answer_with_an_empty_thought():
    # <think>\n\n</think>\n\nOK.<|im_end|>: 6 loss-mask tokens in Qwen3, 4 of them after </think>.
    row = sample(turn(reasoning="", content="OK.", reasoning_ids=2, answer_ids=4))
    quality, details = classify_sample(row, T)
    assert quality == "stub_answer"
    assert details[0]["flags"] == ["stub_answer", "empty_reasoning"]


def test_the_stub_threshold_is_configurable():
    row = sample(turn(reasoning=None, thinking=False, content="Yes, it is Paris.", answer_ids=8), thinking=False)
    assert classify_sample(row, T)[0] == "ok"
    assert classify_sample(row, Thresholds(stub_answer_max_tokens=8))[0] == "stub_answer"


def test_a_short_answer_after_a_real_thought_is_not_a_stub():
    # A multiple-choice "B" after a long reasoning is good training data.
    row = sample(turn(reasoning="The options differ in ... so B.", reasoning_ids=2000, content="B", answer_ids=3))
    assert classify_sample(row, T)[0] == "ok"


def test_a_stub_without_thinking_counts_the_whole_completion_when_answer_tokens_are_unknown():
    message, event = turn(content="OK.", thinking=False, answer_ids=3)
    event["answer_tokens"] = None
    assert classify_sample(sample((message, event), thinking=False), T)[0] == "stub_answer"


def test_a_finished_turn_without_answer_or_tool_call_is_an_empty_answer():
    assert classify_sample(sample(turn(content="", answer_ids=1)), T)[0] == "empty_answer"


def test_a_tool_call_turn_with_empty_content_is_not_an_empty_answer():
    row = sample(turn(content="", answer_ids=30, tool_calls=CALL), turn())
    assert classify_sample(row, T)[0] == "ok"


def test_an_empty_thought_with_a_real_answer_is_empty_reasoning_only_when_thinking_is_on():
    row = sample(turn(reasoning=""))
    assert classify_sample(row, T)[0] == "empty_reasoning"
    no_thinking = sample(turn(reasoning=None, thinking=False), thinking=False)
    assert classify_sample(no_thinking, T)[0] == "ok"


def test_cut_off_before_think_end_is_truncated_reasoning():
    row = sample(turn(content="", finish="length", answer_ids=0, truncated_in_reasoning=True))
    quality, details = classify_sample(row, T)
    assert quality == "truncated_reasoning"
    assert details[0]["flags"] == ["truncated_reasoning"]  # not also empty answer or empty thought


def test_an_aborted_generation_inside_the_thought_is_truncated_reasoning_too():
    row = sample(turn(content="", finish="abort", answer_ids=0))
    assert classify_sample(row, T)[0] == "truncated_reasoning"


def test_cut_off_after_think_end_is_truncated_answer():
    assert classify_sample(sample(turn(finish="length")), T)[0] == "truncated_answer"
    no_thinking = sample(turn(finish="length", thinking=False), thinking=False)
    assert classify_sample(no_thinking, T)[0] == "truncated_answer"


def test_leftover_think_tags_are_bad_think_tags():
    row = sample(turn(content="Paris. </think> Really Paris.", think_tags_ok=False))
    assert classify_sample(row, T)[0] == "bad_think_tags"


def test_a_tool_call_that_does_not_parse_is_invalid_tool_json():
    error = {"index": 0, "error": "invalid JSON: Expecting value at char 9", "raw": "<tool_call>{\"name\": }"}
    row = sample(turn(content="<tool_call>{\"name\": }", tool_errors=[error], answer_ids=9))
    assert classify_sample(row, T)[0] == "invalid_tool_json"


def test_a_long_completion_that_repeats_itself_is_a_repetition_loop():
    loop = words(300, 1) + [THINK_END] + words(40, 3) * 30
    row = sample(turn(completion=loop, finish="length", answer_ids=1200))
    quality, details = classify_sample(row, T)
    assert quality == "repetition_loop"
    assert details[0]["flags"] == ["repetition_loop", "truncated_answer"]
    assert details[0]["repetition_share"] > 0.9


def test_a_loop_that_starts_late_is_found_in_the_second_half():
    ids = words(3000, 4) + words(25, 5) * 60  # 4500 ids, the last third a loop
    assert repetition_share(ids, 12, 200) > 0.5
    assert repetition_share(ids[:3000], 12, 200) == 0.0


def test_prose_and_short_completions_are_not_loops():
    assert repetition_share(words(5000), 12, 200) == 0.0
    short = [5, 6, 7] * 50  # 150 ids: perfectly periodic but below the minimum length
    assert repetition_share(short, 12, 200) == 0.0
    assert repetition_share(short, 12, 100) > 0.9


def test_the_repetition_share_counts_only_copies():
    # Two copies of a 500-id text: about half of all n-grams, and all of the second half's, are copies.
    once = words(500, 6)
    assert repetition_share(once + once, 12, 200) == pytest.approx(1.0, abs=0.03)
    assert repetition_share(once + words(500, 7), 12, 200) == 0.0


def test_a_failed_sample_is_failed_whatever_it_holds():
    row = {"sample_id": "s", "status": "failed", "thinking": True, "messages": None, "events": [],
           "error": {"reason": "prompt_too_long", "detail": "9000 > 8192"}}
    assert classify_sample(row, T) == ("failed", [])


def test_the_sample_is_its_worst_turn_and_details_follow_the_events():
    row = sample(turn(content="", answer_ids=40, tool_calls=CALL), turn(finish="length"))
    quality, details = classify_sample(row, T)
    assert quality == "truncated_answer"
    assert [d["quality"] for d in details] == ["ok", "truncated_answer"]
    assert [d["turn"] for d in details] == [0, 1]


def test_severity_puts_failed_first_and_ok_last():
    assert CLASSES[0] == "failed" and CLASSES[-1] == "ok"
    assert set(BAD_CLASSES) == set(CLASSES) - {"ok"}
    assert worst(["ok", "truncated_answer", "stub_answer"]) == "stub_answer"
    assert worst([]) == "ok"
    assert {q.value for q in Quality} == set(CLASSES)


# --- thresholds --------------------------------------------------------------------------------


def test_thresholds_merge_overrides_onto_defaults_and_round_trip():
    t = Thresholds.from_json({"stub_answer_max_tokens": 3, "gate": {"repetition_loop": 0.5, "failed": None}})
    assert t.stub_answer_max_tokens == 3
    assert t.gate["repetition_loop"] == 0.5
    assert "failed" not in t.gate
    assert t.gate["stub_answer+empty_answer"] == DEFAULT_GATE["stub_answer+empty_answer"]
    assert t.to_json() == {"stub_answer_max_tokens": 3, "gate": {"repetition_loop": 0.5, "failed": None}}
    assert Thresholds.from_json(t.to_json()) == t
    assert Thresholds.from_json(None) == Thresholds() and Thresholds().to_json() == {}


@pytest.mark.parametrize("bad", [
    {"stub_tokens": 3},
    {"gate": {"stub_answer+nonsense": 0.2}},
    {"gate": {"ok": 0.5}},
    {"gate": {"failed": 1.5}},
    {"gate": ["failed"]},
    {"repetition_max_share": "half"},
    {"gate_min_samples": 0},
])
def test_bad_thresholds_are_refused_with_a_config_error(bad):
    with pytest.raises(ConfigError):
        Thresholds.from_json(bad)


# --- the gate's maths ---------------------------------------------------------------------------


def test_the_gate_waits_for_its_minimum_sample_count():
    decision = judge({"stub_answer": 199}, T)
    assert not decision.pause
    assert decision.classified == 199 and "too few" in decision.reason


def test_the_gate_pauses_when_grouped_classes_together_pass_their_limit():
    # 12% stubs + 10% empty answers: each alone under 20%, together over it.
    decision = judge({"ok": 156, "stub_answer": 24, "empty_answer": 20}, T)
    assert decision.pause
    assert decision.exceeded == ("stub_answer+empty_answer",)
    assert "stub_answer+empty_answer 22.0% > 20%" in decision.reason
    assert decision.shares["stub_answer"] == pytest.approx(0.12)


def test_the_gate_lets_a_run_within_every_limit_go_on():
    decision = judge({"ok": 150, "stub_answer": 20, "truncated_answer": 30}, T)
    assert not decision.pause and decision.exceeded == ()
    assert sum(decision.shares.values()) == pytest.approx(1.0)


def test_a_share_exactly_at_the_limit_does_not_pause():
    assert not judge({"ok": 160, "stub_answer": 40}, T).pause
    assert judge({"ok": 159, "stub_answer": 41}, T).pause


def test_an_overridden_gate_measures_but_never_pauses():
    decision = judge({"stub_answer": 300}, Thresholds(gate_overridden=True))
    assert not decision.pause
    assert decision.exceeded == ("stub_answer+empty_answer",)
    assert "overridden" in decision.reason


def test_the_87_percent_stub_run_is_paused_by_the_defaults():
    decision = judge({"stub_answer": 174, "ok": 26}, T)
    assert decision.pause and "87.0%" in decision.reason


def test_a_call_to_a_tool_not_offered_is_its_own_class():
    offered = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    other = [{"id": "call_0_0", "type": "function", "function": {"name": "run_shell", "arguments": {}}}]
    row = {**sample(turn(content="", tool_calls=other)), "tools": offered}
    quality, details = classify_sample(row, T)
    assert quality == "unoffered_tool" and details[0]["flags"] == ["unoffered_tool"]
    # The offered tool is fine; with no tools offered at all, any call is unoffered.
    assert classify_sample({**sample(turn(content="", tool_calls=CALL)), "tools": offered}, T)[0] == "ok"
    assert classify_sample({**sample(turn(content="", tool_calls=CALL)), "tools": None}, T)[0] == "unoffered_tool"
    assert "unoffered_tool" in BAD_CLASSES and DEFAULT_GATE["unoffered_tool"] == 0.10


def test_the_ledger_constraint_admits_exactly_the_quality_classes():
    """A new class without a migration would fail at the first commit of such a sample."""
    import importlib

    latest = importlib.import_module("migrations.versions.0013_tool_args_differ")  # the last to change the classes
    assert set(latest.AFTER) == set(CLASSES)
