"""Generated text to assistant message: reasoning split and tool-call parsing (Qwen3 conventions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from targets.parsing import parse_tool_calls, split_reasoning
from tests.support.helpers import require

TEMPLATE = Path(__file__).resolve().parents[2] / "worker" / "tiny" / "templates" / "qwen3_chat.jinja"


# --- split_reasoning ---------------------------------------------------------------------


def test_thinking_turn_splits_thought_from_answer_and_strips_template_newlines():
    split = split_reasoning("<think>\nLet me add.\n</think>\n\nIt is 4.", thinking=True, finish_reason="stop")
    assert split.reasoning_content == "Let me add."
    assert split.content == "It is 4."
    assert split.think_tags_ok and not split.truncated_in_reasoning


def test_thinking_turn_without_generated_opening_tag_is_split_the_same():
    # Templates that put "<think>\n" in the prompt leave the model to write only the rest.
    split = split_reasoning("Let me add.\n</think>\n\nIt is 4.", thinking=True, finish_reason="stop")
    assert (split.reasoning_content, split.content, split.think_tags_ok) == ("Let me add.", "It is 4.", True)


def test_empty_thought_is_an_empty_string_not_none():
    split = split_reasoning("<think>\n\n</think>\n\nHi.", thinking=True, finish_reason="stop")
    assert split.reasoning_content == ""
    assert split.content == "Hi."


def test_spaces_inside_the_answer_are_the_models_own_text_and_are_kept():
    split = split_reasoning("<think>\nx\n</think>\n\n  indented\n", thinking=True, finish_reason="stop")
    assert split.content == "  indented"


def test_non_thinking_turn_is_all_content_and_has_no_reasoning():
    split = split_reasoning("\nJust the answer.\n", thinking=False, finish_reason="stop")
    assert split.reasoning_content is None
    assert split.content == "Just the answer."
    assert split.think_tags_ok


def test_non_thinking_turn_with_a_think_tag_is_flagged_and_kept_as_generated():
    split = split_reasoning("oops</think>answer", thinking=False, finish_reason="stop")
    assert split.content == "oops</think>answer"
    assert not split.think_tags_ok


def test_truncation_inside_the_thought_leaks_nothing_into_content():
    text = "<think>\nStep one: secret plan. Step two"
    split = split_reasoning(text, thinking=True, finish_reason="length")
    assert split.content == ""
    assert split.truncated_in_reasoning
    assert split.reasoning_content == "Step one: secret plan. Step two"
    # Truncation is not a tag error: the model never got to close the thought.
    assert split.think_tags_ok


def test_truncation_after_the_thought_is_not_truncation_in_reasoning():
    split = split_reasoning("<think>\nr\n</think>\n\nThe answer is", thinking=True, finish_reason="length")
    assert not split.truncated_in_reasoning
    assert split.content == "The answer is"


def test_a_thought_the_model_stopped_without_closing_is_flagged_and_not_used_as_answer():
    split = split_reasoning("<think>\nI will just stop", thinking=True, finish_reason="stop")
    assert split.content == ""
    assert split.reasoning_content == "I will just stop"
    assert not split.think_tags_ok
    assert not split.truncated_in_reasoning


@pytest.mark.parametrize(
    "text",
    [
        "<think>\nr\n</think>\n\nanswer </think> again",
        "<think>\nr\n</think>\n\nanswer <think>more</think>",
        "<think>\nr <think> nested\n</think>\n\nanswer",
    ],
)
def test_leftover_think_tags_are_flagged_and_the_answer_is_kept_as_generated(text):
    split = split_reasoning(text, thinking=True, finish_reason="stop")
    assert not split.think_tags_ok
    assert split.content == text.split("</think>", 1)[1].strip("\n")


# --- parse_tool_calls ----------------------------------------------------------------------


def _call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_answer_without_tool_calls_is_returned_stripped():
    parsed = parse_tool_calls("  Hello.\n")
    assert parsed == type(parsed)(content="Hello.", tool_calls=[], errors=[], unterminated=False)


def test_single_call_is_normalised_with_an_id_and_text_outside_is_content():
    parsed = parse_tool_calls("Let me check.\n" + _call("get_weather", {"city": "Paris"}))
    assert parsed.content == "Let me check."
    assert parsed.tool_calls == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }
    ]
    assert parsed.errors == []


def test_parallel_calls_keep_their_order_and_get_consecutive_ids():
    text = _call("get_weather", {"city": "Paris"}) + "\n" + _call("get_time", {"tz": "CET"})
    parsed = parse_tool_calls(text, id_prefix="call_3_")
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["get_weather", "get_time"]
    assert [c["id"] for c in parsed.tool_calls] == ["call_3_0", "call_3_1"]
    assert parsed.content == ""


def test_invalid_json_block_is_recorded_with_its_raw_text_and_valid_calls_survive():
    bad = '<tool_call>\n{"name": "get_time", "arguments": {tz: CET}}\n</tool_call>'
    parsed = parse_tool_calls(_call("get_weather", {"city": "Paris"}) + "\n" + bad)
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["get_weather"]
    assert len(parsed.errors) == 1
    assert parsed.errors[0]["index"] == 1
    assert parsed.errors[0]["raw"] == bad
    assert parsed.errors[0]["error"].startswith("invalid JSON")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('{"arguments": {}}', "call has no name"),
        ('{"name": "", "arguments": {}}', "call has no name"),
        ('{"name": "f", "arguments": [1, 2]}', "arguments are a JSON list, not an object"),
        ('{"name": "f", "arguments": "{\\"x\\": 1}"}', "arguments are a JSON str, not an object"),
        ('{"name": "f"}', "call has no arguments"),
        ('["f", {}]', "call is a JSON list, not an object"),
        ("", "empty tool_call block"),
    ],
)
def test_malformed_calls_are_errors_never_silently_dropped(body, error):
    parsed = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>")
    assert parsed.tool_calls == []
    assert parsed.errors == [{"index": 0, "error": error, "raw": f"<tool_call>\n{body}\n</tool_call>"}]


def test_unterminated_block_cut_mid_json_is_an_error_and_flagged():
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "argum'
    parsed = parse_tool_calls(text)
    assert parsed.unterminated
    assert parsed.tool_calls == []
    assert parsed.errors[0]["raw"] == '<tool_call>\n{"name": "get_weather", "argum'
    assert parsed.content == "Checking."


def test_unterminated_block_with_complete_json_is_a_call_but_flagged():
    parsed = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n')
    assert parsed.unterminated
    assert parsed.tool_calls[0]["function"] == {"name": "f", "arguments": {"a": 1}}


def test_qwen35_xml_calls_keep_argument_values_as_written():
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        '<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{"metric": true}\n</parameter>\n'
        "</function>\n</tool_call>"
    )
    parsed = parse_tool_calls(text)
    assert parsed.errors == []
    assert parsed.tool_calls[0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Paris", "days": "3", "opts": '{"metric": true}'},
    }


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("<function=>\n</function>", "call has no name"),
        ("<function=f>\nstray words\n</function>", "text outside <parameter=...> in function body"),
        (
            "<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>",
            "duplicate parameter 'a'",
        ),
    ],
)
def test_malformed_xml_calls_are_errors(body, error):
    parsed = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>")
    assert parsed.tool_calls == []
    assert parsed.errors[0]["error"] == error


# --- round trip through the chat template ---------------------------------------------------


def test_a_parsed_turn_renders_back_to_exactly_the_generated_text():
    """The next turn's context must hold the model's own text, not a repaired version of it."""
    render = require("transformers.utils.chat_template_utils", "vLLM's CPU build brings it (pip install -e '.[cpu]')"
                     ).render_jinja_template
    generated = (
        "<think>\nTwo lookups.\n</think>\n\nOne moment.\n"
        + _call("get_weather", {"city": "Paris"})
        + "\n"
        + _call("get_time", {"tz": "CET"})
    )
    split = split_reasoning(generated, thinking=True, finish_reason="stop")
    parsed = parse_tool_calls(split.content)
    message = {
        "role": "assistant",
        "content": parsed.content,
        "reasoning_content": split.reasoning_content,
        "tool_calls": parsed.tool_calls,
    }
    rendered, _ = render([[{"role": "user", "content": "hi"}, message]], chat_template=TEMPLATE.read_text())
    assert rendered[0].endswith("<|im_start|>assistant\n" + generated + "<|im_end|>\n")
