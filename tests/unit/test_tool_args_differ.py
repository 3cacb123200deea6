"""Spliced results that match their calls: a call with other arguments than its source call is flagged or stops.

The model asked ``get_weather {"city": "Berlin"}`` and the source's result is Oslo's: spliced, the row says so
(``tool_args_differ`` on the turn's event and the row, the quality class of the same name); with
``--on-tool-mismatch stop`` the conversation ends at that call instead. Parallel calls pair one by one.
"""

from __future__ import annotations

import pytest

from ledger.quality import Thresholds, classify_sample
from tests.unit.test_dialogue import USER, Engine, call, run
from worker.conversation.splice import same_arguments, splice_all

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
ANSWER = "It is three degrees in Oslo today, with wind and some rain later in the afternoon."
OSLO = {"role": "tool", "tool_call_id": "s1", "content": '{"city": "Oslo", "temp": 3}'}
LIMA = {"role": "tool", "tool_call_id": "s2", "content": '{"city": "Lima", "temp": 20}'}


def _source_call(call_id: str, city: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}


def _conversation(*cities: str, results=(OSLO, LIMA)) -> dict:
    calls = [_source_call(f"s{n + 1}", city) for n, city in enumerate(cities)]
    return {"sample_id": "w", "messages": [
        USER, {"role": "assistant", "content": "", "tool_calls": calls}, *results[:len(cities)],
        {"role": "assistant", "content": "Cold."}]}


def _weather(city: str) -> str:
    return call("get_weather", {"city": city})


def _row(result, thinking: bool = False) -> dict:
    return {"status": "done", "thinking": thinking, "tools": TOOLS, "messages": result.messages,
            "events": result.events}


def test_a_call_with_the_source_calls_arguments_is_not_flagged():
    result = run(_conversation("Oslo"), Engine({0: _weather("Oslo"), 1: ANSWER}), thinking=False)
    assert result.stop_reason is None and result.turns == 2
    assert [e["tool_args_differ"] for e in result.events] == [[], []]
    quality, details = classify_sample(_row(result), Thresholds())
    assert "tool_args_differ" not in details[0]["flags"]


def test_a_call_with_other_arguments_is_spliced_and_flagged_on_its_turn():
    result = run(_conversation("Oslo"), Engine({0: _weather("Berlin"), 1: ANSWER}), thinking=False)
    assert result.stop_reason is None and result.turns == 2
    assert result.messages[2]["content"] == OSLO["content"]   # spliced, as before
    assert result.events[0]["tool_args_differ"] == [
        {"name": "get_weather", "arguments": {"city": "Berlin"}, "source_arguments": {"city": "Oslo"},
         "spliced": True}]
    quality, details = classify_sample(_row(result), Thresholds())
    assert "tool_args_differ" in details[0]["flags"] and quality == "tool_args_differ"


def test_stop_ends_the_conversation_at_the_mismatched_call_with_its_reason_and_no_flag():
    result = run(_conversation("Oslo"), Engine({0: _weather("Berlin"), 1: ANSWER}), thinking=False,
                 on_tool_mismatch="stop")
    assert result.turns == 1 and result.stop_code == "tool_args_differ"
    assert result.stop_reason == 'tool_args_differ: get_weather {"city": "Berlin"} != source {"city": "Oslo"}'
    assert [m["role"] for m in result.messages] == ["user", "assistant"]   # no Oslo result after Berlin
    assert result.events[0]["tool_args_differ"][0]["spliced"] is False
    quality, _ = classify_sample(_row(result), Thresholds())
    assert quality == "ok"


def test_stop_goes_on_where_the_arguments_match():
    result = run(_conversation("Oslo"), Engine({0: _weather("Oslo"), 1: ANSWER}), thinking=False,
                 on_tool_mismatch="stop")
    assert result.stop_reason is None and result.turns == 2


def test_parallel_calls_in_another_order_pair_one_by_one_with_their_own_arguments():
    engine = Engine({0: f"{_weather('Lima')}\n{_weather('Oslo')}", 1: ANSWER})
    result = run(_conversation("Oslo", "Lima"), engine, thinking=False)
    assert result.stop_reason is None
    # Each call gets the result of the source call with its arguments, whatever the order.
    assert [m["content"] for m in result.messages[2:4]] == [LIMA["content"], OSLO["content"]]
    assert result.events[0]["tool_args_differ"] == []


def test_of_parallel_calls_only_the_one_with_other_arguments_is_flagged():
    engine = Engine({0: f"{_weather('Lima')}\n{_weather('Quito')}", 1: ANSWER})
    result = run(_conversation("Oslo", "Lima"), engine, thinking=False)
    assert [m["content"] for m in result.messages[2:4]] == [LIMA["content"], OSLO["content"]]
    assert [(d["arguments"], d["source_arguments"]) for d in result.events[0]["tool_args_differ"]] == [
        ({"city": "Quito"}, {"city": "Oslo"})]


@pytest.mark.parametrize(("got", "expected", "same"), [
    ({"n": 3}, {"n": "3"}, True),              # typed by the parser's schema, text in the source
    ({"q": "a b"}, {"q": "a b"}, True),
    ({"ok": True}, {"ok": "true"}, True),
    ({"city": "Berlin"}, {"city": "Oslo"}, False),
    ({"city": "Oslo"}, {"city": "Oslo", "units": "C"}, False),
    ({"ids": [1, 2]}, {"ids": [2, 1]}, False),
])
def test_arguments_compare_as_objects_with_text_equal_to_its_typed_value(got, expected, same):
    assert same_arguments(got, expected) is same


def test_source_arguments_as_json_text_compare_as_objects():
    calls = [{"id": "m1", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    source = [{"id": "s1", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    spliced, stop, differ = splice_all(calls, source, [OSLO])
    assert (len(spliced), stop, differ) == (1, None, [])
