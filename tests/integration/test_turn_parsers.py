"""vLLM's own parsers read regen's turns, with regen's rules around them (targets/turn_parsers.py).

Runs vLLM's real parser classes (the CPU build's) over completions tokenised by the
tiny model's tokenizer, as the worker hands them over: engine ids, end-of-turn id
last. Where the Qwen format is concerned, the result must equal regen's own parser's.
"""

from __future__ import annotations

import pytest

from targets.turn_parsers import ParserUnavailable, RegenQwenParser, load_turn_parser
from tests.fixtures.model import VLLM_HINT
from tests.support.helpers import require
from worker.conversation.dialogue import Generation

require("vllm", VLLM_HINT, module_level=True)

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "run_shell", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def qwen(tokenizer):
    return load_turn_parser(tokenizer, reasoning="qwen3", tool="hermes")


def _gen(tokenizer, text: str, finish: str = "stop") -> Generation:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if finish == "stop":
        ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return Generation(prompt_token_ids=[1], token_ids=ids, text=tokenizer.decode(ids, skip_special_tokens=True),
                      finish_reason=finish)


def test_vllms_classes_ran_and_the_row_can_say_so(qwen):
    assert qwen.description["by"].startswith("vllm ")
    assert (qwen.description["reasoning"], qwen.description["tool"]) == ("qwen3", "hermes")
    assert qwen.think_end_id is not None


def test_thought_answer_and_calls_as_regens_own_parser_reads_them(tokenizer, qwen):
    regen = RegenQwenParser(tokenizer)
    texts = [
        "<think>\nthe user wants a file\n</think>\n\nLet me look. <tool_call>\n"
        '{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>',
        "<think>\nfirst\n</think>\n\n<tool_call>\n" '{"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>\n'
        "<tool_call>\n" '{"name": "run_shell", "arguments": {"cmd": "ls -l"}}\n</tool_call>',
        "<think>\n\n</think>\n\nJust an answer, with no call.",
        # Malformed: a second thought in the answer. Kept as written and flagged, not tidied up.
        "<think>\nfirst\n</think>\n\nan answer <think>again</think> and more",
    ]
    for text in texts:
        g = _gen(tokenizer, text)
        ours = regen.parse(g, thinking=True, tools=TOOLS, turn=2)
        theirs = qwen.parse(g, thinking=True, tools=TOOLS, turn=2)
        assert theirs == ours, text
        # As the worker's engine hands it over: ids only (vLLM does not detokenize), decoded by the parser.
        ids_only = Generation(prompt_token_ids=[1], token_ids=g.token_ids, finish_reason=g.finish_reason)
        assert regen.parse(ids_only, thinking=True, tools=TOOLS, turn=2) == ours, text
        assert qwen.parse(ids_only, thinking=True, tools=TOOLS, turn=2) == ours, text
    malformed, _ = qwen.parse(_gen(tokenizer, texts[3]), thinking=True, tools=TOOLS, turn=0)
    assert (malformed.content, malformed.think_tags_ok) == ("an answer <think>again</think> and more", False)
    split, calls = qwen.parse(_gen(tokenizer, texts[1]), thinking=True, tools=TOOLS, turn=2)
    assert [c["id"] for c in calls.tool_calls] == ["call_2_0", "call_2_1"]   # deterministic, not vLLM's random ids
    assert calls.tool_calls[1]["function"] == {"name": "run_shell", "arguments": {"cmd": "ls -l"}}


def test_a_thought_cut_off_by_max_tokens_never_becomes_the_answer(tokenizer, qwen):
    split, calls = qwen.parse(_gen(tokenizer, "<think>\nstill thinking about it", finish="length"),
                              thinking=True, tools=TOOLS, turn=0)
    assert (split.reasoning_content, split.content, split.truncated_in_reasoning) == ("still thinking about it", "", True)
    assert calls.tool_calls == [] and calls.errors == []
    # Stopping inside a thought is a malformed turn, kept as thought, flagged.
    stopped, _ = qwen.parse(_gen(tokenizer, "<think>\nno end"), thinking=True, tools=TOOLS, turn=0)
    assert (stopped.content, stopped.truncated_in_reasoning, stopped.think_tags_ok) == ("", False, False)


def test_a_turn_without_thinking_is_all_answer(tokenizer, qwen):
    split, _ = qwen.parse(_gen(tokenizer, "\nplain answer </think> here"), thinking=False, tools=None, turn=0)
    assert (split.reasoning_content, split.content, split.think_tags_ok) == (None, "plain answer </think> here", False)


def test_an_unreadable_call_is_recorded_with_its_text_not_dropped(tokenizer, qwen):
    text = "<think>\nx\n</think>\n\n<tool_call>\n{bad json}\n</tool_call>"
    split, calls = qwen.parse(_gen(tokenizer, text), thinking=True, tools=TOOLS, turn=0)
    assert calls.tool_calls == []
    [error] = calls.errors
    assert "hermes" in error["error"] and "{bad json}" in error["raw"]
    assert split.content == "<tool_call>\n{bad json}\n</tool_call>"


def test_arguments_that_are_not_an_object_are_that_calls_error(tokenizer, qwen):
    text = '<think>\nx\n</think>\n\n<tool_call>\n{"name": "read_file", "arguments": "a.txt"}\n</tool_call>'
    _, calls = qwen.parse(_gen(tokenizer, text), thinking=True, tools=TOOLS, turn=0)
    assert calls.tool_calls == [] and len(calls.errors) == 1 and "not an object" in calls.errors[0]["error"]


def test_qwen35_xml_calls_through_vllms_qwen3_coder_parser(tokenizer):
    parser = load_turn_parser(tokenizer, reasoning="qwen3", tool="qwen3_coder")
    text = ("<think>\nok\n</think>\n\n<tool_call>\n<function=run_shell>\n<parameter=cmd>\nls -l\n</parameter>\n"
            "</function>\n</tool_call>")
    split, calls = parser.parse(_gen(tokenizer, text), thinking=True, tools=TOOLS, turn=1)
    assert split.reasoning_content == "ok"
    assert [c["function"] for c in calls.tool_calls] == [{"name": "run_shell", "arguments": {"cmd": "ls -l"}}]


def test_a_parser_this_vllm_lacks_is_refused_by_name(tokenizer):
    with pytest.raises(ParserUnavailable, match="no_such_parser"):
        load_turn_parser(tokenizer, reasoning=None, tool="no_such_parser")


@pytest.mark.parametrize(("reasoning", "tool", "named"), [
    ("openai_gptoss", "hermes", "reasoning parser 'openai_gptoss' raised NotImplementedError"),
    (None, "openai", "tool parser 'openai' raised NotImplementedError"),
])
def test_a_parser_that_raises_fails_the_sample_as_parser_error_naming_it(tokenizer, reasoning, tool, named):
    """vLLM's own gpt-oss text parsers raise on use (gpt-oss is read with Harmony): named on a run that is not
    rendered with Harmony, each turn they cannot read fails its sample, with the parser's name, never the batch."""
    import asyncio

    from targets.turn_parsers import ParserFailed
    from worker.conversation.dialogue import SampleError, regenerate_conversation

    parser = load_turn_parser(tokenizer, reasoning=reasoning, tool=tool)
    with pytest.raises(ParserFailed, match=named):
        parser.parse(_gen(tokenizer, "<think>\nhm\n</think>\n\nJust an answer."), thinking=True, tools=None, turn=0)

    async def generate(prompt_ids, turn):
        ids = tokenizer.encode("<think>\nhm\n</think>\n\nJust an answer.", add_special_tokens=False)
        return Generation(prompt_token_ids=prompt_ids, token_ids=[*ids, tokenizer.convert_tokens_to_ids("<|im_end|>")],
                          finish_reason="stop")

    sample = {"sample_id": "s", "messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello"}]}
    with pytest.raises(SampleError) as caught:
        asyncio.run(regenerate_conversation(sample, thinking=True, render=lambda m, t: [1, 2, 3], generate=generate,
                                            parser=parser))
    assert caught.value.reason == "parser_error" and named in caught.value.detail
    assert f"reasoning {reasoning or 'none'}, tool {tool}" in caught.value.detail

