"""Real targets' published chat templates, read the way their own serving stack reads them.

Each published template (tests/data/templates, SOURCES.md) is swapped into the tokenizer
of its family's tiny model (the family's special tokens, as in the real tokenizer). With no
parser named, the worker's Renderer chooses the parsers and the thinking argument by
rendering the template; prompts end as the template says for thinking on and off; and
completions written in the real format, as engine ids, are split by vLLM's parsers the way
the prompt says: a prompt that closed the thought leaves all answer, one that opened it
leaves thought up to ``</think>`` (reasoning cut short where it never comes).
No engine runs here: the completions are the published format, not what a tiny model writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.conversation.dialogue import Generation

pytest.importorskip("vllm")

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "templates"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
#: AUTO parsers and thinking argument: a run submitted for a model the producer could not read.
SAMPLING = {"reasoning_parser": "auto", "tool_parser": "auto", "thinking_arg": "auto"}


def _renderer(tiny_family_model, family: str, template: str):
    from transformers import AutoTokenizer

    from worker.conversation.rendering import Renderer

    tokenizer = AutoTokenizer.from_pretrained(tiny_family_model(family))
    tokenizer.chat_template = (PUBLISHED / template).read_text()
    return Renderer(tokenizer, 4096)


@pytest.fixture(scope="module")
def r1(tiny_family_model):
    return _renderer(tiny_family_model, "deepseek_r1", "deepseek_r1.jinja")


@pytest.fixture(scope="module")
def v31(tiny_family_model):
    return _renderer(tiny_family_model, "deepseek_r1", "deepseek_v31.jinja")


@pytest.fixture(scope="module")
def qwen(tiny_family_model):
    return _renderer(tiny_family_model, "qwen3", "qwen3.jinja")


@pytest.fixture(scope="module")
def llama31(tiny_family_model):
    return _renderer(tiny_family_model, "llama3", "llama31.jinja")


@pytest.fixture(scope="module")
def glm(tiny_family_model):
    return _renderer(tiny_family_model, "glm45", "glm45.jinja")


def _prompt(renderer, *, thinking: bool, messages=None, tools=None) -> tuple[list[int], str]:
    messages = messages or [{"role": "user", "content": "What is the weather in Paris?"}]
    ids = renderer.render(messages, tools, thinking=thinking, thinking_arg=renderer.thinking_arg_for(SAMPLING))
    return ids, renderer.tokenizer.decode(ids, skip_special_tokens=False)


def _parse(renderer, prompt_ids, text: str, *, thinking: bool, end: str | None, finish: str = "stop", tools=None):
    tokenizer = renderer.tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False)
    stop = None
    if finish == "stop" and end:
        # As the engine reports a stop token: its id last, and as the stop reason.
        stop = tokenizer.convert_tokens_to_ids(end)
        ids.append(stop)
    generation = Generation(prompt_token_ids=prompt_ids, token_ids=ids, finish_reason=finish, stop_reason=stop)
    return renderer.parser_for(SAMPLING).parse(generation, thinking=thinking, tools=tools, turn=0)


def test_r1_always_thinks_and_its_calls_are_read_by_deepseek_v3(r1):
    parser = r1.parser_for(SAMPLING)
    assert (parser.description["reasoning"], parser.description["tool"]) == ("deepseek_r1", "deepseek_v3")
    assert r1.thinking_arg_for(SAMPLING) is None
    ids, text = _prompt(r1, thinking=True, tools=WEATHER)
    assert text.endswith("<｜Assistant｜><think>\n")
    split, calls = _parse(r1, ids, "The user wants Paris.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
                          "function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"
                          "<｜tool▁calls▁end｜>", thinking=True, end="<｜end▁of▁sentence｜>", tools=WEATHER)
    assert split.reasoning_content == "The user wants Paris."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert not calls.errors


def test_v31_renders_thinking_on_and_off_through_its_thinking_argument(v31):
    assert v31.thinking_arg_for(SAMPLING) == "thinking"
    parser = v31.parser_for(SAMPLING)
    assert (parser.description["reasoning"], parser.description["tool"]) == ("deepseek_v3", "deepseek_v31")
    on_ids, on = _prompt(v31, thinking=True)
    off_ids, off = _prompt(v31, thinking=False)
    assert on.endswith("<｜Assistant｜><think>") and off.endswith("<｜Assistant｜></think>")

    eos = "<｜end▁of▁sentence｜>"
    split, _ = _parse(v31, on_ids, "Paris is in France.</think>It is sunny.", thinking=True, end=eos)
    assert (split.reasoning_content, split.content) == ("Paris is in France.", "It is sunny.")
    # Off: the prompt closed the thought; the whole completion is the answer, even if the row says thinking.
    for flag in (False, True):
        split, _ = _parse(v31, off_ids, "It is sunny.", thinking=flag, end=eos)
        assert (split.reasoning_content, split.content) == (None, "It is sunny."), flag
    # On, cut off before </think>: reasoning cut short, no answer.
    split, _ = _parse(v31, on_ids, "Paris is in", thinking=True, end=None, finish="length")
    assert (split.reasoning_content, split.content, split.truncated_in_reasoning) == ("Paris is in", "", True)


def test_v31_calls_are_read_by_deepseek_v31(v31):
    off_ids, _ = _prompt(v31, thinking=False, tools=WEATHER)
    _, calls = _parse(v31, off_ids, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                      "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", thinking=False,
                      end="<｜end▁of▁sentence｜>", tools=WEATHER)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("get_weather", {"city": "Paris"})]


def test_glm45_switches_with_enable_thinking_and_its_xml_calls_are_read(glm):
    assert glm.thinking_arg_for(SAMPLING) == "enable_thinking"
    on_ids, on = _prompt(glm, thinking=True, tools=WEATHER)
    off_ids, off = _prompt(glm, thinking=False, tools=WEATHER)
    assert on.endswith("<|assistant|>") and off.endswith("<|assistant|>\n<think></think>")
    split, calls = _parse(glm, on_ids, "\n<think>Paris, then.</think>\n<tool_call>get_weather\n<arg_key>city"
                          "</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", thinking=True,
                          end="<|observation|>", tools=WEATHER)
    assert split.reasoning_content == "Paris, then."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    split, _ = _parse(glm, off_ids, "\nIt is sunny.", thinking=True, end="<|user|>")
    assert (split.reasoning_content, split.content) == (None, "It is sunny.")


def test_qwen3_switches_with_enable_thinking_and_its_json_calls_are_read_by_hermes(qwen):
    assert qwen.thinking_arg_for(SAMPLING) == "enable_thinking"
    parser = qwen.parser_for(SAMPLING)
    assert (parser.description["reasoning"], parser.description["tool"]) == ("qwen3", "hermes")
    on_ids, on = _prompt(qwen, thinking=True, tools=WEATHER)
    off_ids, off = _prompt(qwen, thinking=False, tools=WEATHER)
    assert on.endswith("<|im_start|>assistant\n") and off.endswith("<think>\n\n</think>\n\n")
    split, calls = _parse(qwen, on_ids, "<think>\nParis.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
                          "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", thinking=True, end="<|im_end|>",
                          tools=WEATHER)
    assert split.reasoning_content == "Paris."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    split, _ = _parse(qwen, off_ids, "It is sunny.", thinking=True, end="<|im_end|>")
    assert (split.reasoning_content, split.content) == (None, "It is sunny.")


def test_llama31_never_thinks_and_its_json_calls_are_read_by_llama3_json(llama31):
    parser = llama31.parser_for(SAMPLING)
    assert (parser.description["reasoning"], parser.description["tool"]) == (None, "llama3_json")
    assert llama31.thinking_arg_for(SAMPLING) is None
    ids, text = _prompt(llama31, thinking=False, tools=WEATHER)
    # The published template's own shape: the fixed system preamble, the tools in the first user turn.
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                           "Environment: ipython\nCutting Knowledge Date: December 2023\n")
    assert '"name": "get_weather"' in text and text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    split, calls = _parse(llama31, ids, '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                          thinking=False, end="<|eot_id|>", tools=WEATHER)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert not calls.errors
    split, calls = _parse(llama31, ids, "It is sunny in Paris.", thinking=False, end="<|eot_id|>", tools=WEATHER)
    assert (split.reasoning_content, split.content, calls.tool_calls) == (None, "It is sunny in Paris.", [])


@pytest.fixture(scope="module")
def k2(tiny_family_model):
    return _renderer(tiny_family_model, "kimi_k2", "kimi_k2_instruct.jinja")


@pytest.fixture(scope="module")
def k2_thinking(tiny_family_model):
    return _renderer(tiny_family_model, "kimi_k2", "kimi_k2_thinking.jinja")


@pytest.fixture(scope="module")
def mistral31(tiny_family_model):
    return _renderer(tiny_family_model, "mistral", "mistral_small31.jinja")


KIMI_CALL = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
             '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>')


def _kimi_history(*, named: bool) -> list[dict]:
    result = {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"temp": 12}'}
    return [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.get_weather:0", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {**result, "name": "get_weather"} if named else result]


def test_kimi_k2_instruct_never_thinks_and_its_calls_are_read_by_kimi_k2(k2):
    parser = k2.parser_for(SAMPLING)
    assert (parser.description["reasoning"], parser.description["tool"]) == (None, "kimi_k2")
    assert k2.thinking_arg_for(SAMPLING) is None
    on_ids, on = _prompt(k2, thinking=True, tools=WEATHER)
    off_ids, _ = _prompt(k2, thinking=False, tools=WEATHER)
    assert on_ids == off_ids and on.endswith("<|im_assistant|>assistant<|im_middle|>")
    assert on.startswith("<|im_system|>tool_declare<|im_middle|>")
    split, calls = _parse(k2, on_ids, "Let me check." + KIMI_CALL, thinking=False, end="<|im_end|>", tools=WEATHER)
    assert split.reasoning_content is None
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("functions.get_weather:0", "get_weather", {"city": "Paris"})]
    assert calls.content == "Let me check." and not calls.errors


def test_kimi_writes_a_tool_results_name_in_place_of_its_role_so_regen_sends_none(k2):
    """What regen splices (no name, as the source row has none) is headed ``tool``, as an OpenAI request's is."""
    _, plain = _prompt(k2, thinking=False, messages=_kimi_history(named=False), tools=WEATHER)
    _, named = _prompt(k2, thinking=False, messages=_kimi_history(named=True), tools=WEATHER)
    assert "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0" in plain
    assert "<|im_system|>get_weather<|im_middle|>## Return of" in named


def test_kimi_k2_thinking_always_thinks_and_reads_thought_answer_and_calls(k2_thinking):
    renderer = k2_thinking
    parser = renderer.parser_for(SAMPLING)
    assert (parser.description["reasoning"], parser.description["tool"]) == ("kimi_k2", "kimi_k2")
    assert renderer.thinking_arg_for(SAMPLING) is None
    ids, text = _prompt(renderer, thinking=True, tools=WEATHER)
    assert text.endswith("<|im_assistant|>assistant<|im_middle|>")   # the model opens the thought
    split, calls = _parse(renderer, ids, "<think>Paris, then.</think>" + KIMI_CALL, thinking=True,
                          end="<|im_end|>", tools=WEATHER)
    assert split.reasoning_content == "Paris, then."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    split, _ = _parse(renderer, ids, "<think>The user wants Paris.</think>It is sunny.", thinking=True,
                      end="<|im_end|>")
    assert (split.reasoning_content, split.content) == ("The user wants Paris.", "It is sunny.")
    split, _ = _parse(renderer, ids, "<think>Paris is", thinking=True, end=None, finish="length")
    assert (split.reasoning_content, split.content, split.truncated_in_reasoning) == ("Paris is", "", True)
    # The template keeps the thought of a tool-calling step and renders the call by its id.
    history = _kimi_history(named=False)
    history[1]["reasoning_content"] = "Paris, then."
    _, text = _prompt(renderer, thinking=True, messages=history, tools=WEATHER)
    assert "<think>Paris, then.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0" in text


def test_mistral_small_never_thinks_and_its_json_calls_are_read_by_mistral_with_nine_character_ids(mistral31):
    from worker.conversation.dialogue import SampleError

    parser = mistral31.parser_for(SAMPLING)
    assert (parser.description["reasoning"], parser.description["tool"]) == (None, "mistral")
    assert mistral31.thinking_arg_for(SAMPLING) is None
    ids, text = _prompt(mistral31, thinking=False, tools=WEATHER)
    assert text.startswith("<s>[SYSTEM_PROMPT]You are a helpful assistant that can call tools.")
    assert text.endswith("[/AVAILABLE_TOOLS][INST]What is the weather in Paris?[/INST]")
    # The id the model wrote is kept (9 alphanumerics); without one, dialogue.py gives one (targets/call_ids.py).
    _, calls = _parse(mistral31, ids, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, '
                      '"id": "abcDEF123"}]', thinking=False, end="</s>", tools=WEATHER)
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("abcDEF123", "get_weather", {"city": "Paris"})]
    split, calls = _parse(mistral31, ids, "It is sunny.", thinking=False, end="</s>", tools=WEATHER)
    assert (split.content, calls.tool_calls) == ("It is sunny.", [])
    # The next turn renders with a valid id; regen's old call_0_0 was refused by the template.
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_0_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "call_0_0", "content": '{"temp": 12}'}]
    with pytest.raises(SampleError, match="Tool call IDs should be alphanumeric strings"):
        _prompt(mistral31, thinking=False, messages=history, tools=WEATHER)
    for message in history[1:]:
        for call in message.get("tool_calls", []):
            call["id"] = "abcDEF123"
    history[2]["tool_call_id"] = "abcDEF123"
    _, text = _prompt(mistral31, thinking=False, messages=history, tools=WEATHER)
    assert '"id": "abcDEF123"}]</s>[TOOL_RESULTS] {"content": {"temp": 12}, "call_id": "abcDEF123"}[/TOOL_RESULTS]' in text


@pytest.fixture(scope="module")
def magistral(tiny_family_model):
    """Magistral Small 1.2's template on the tiny Magistral tokenizer (Tekken v13's tokens, special as there:
    ``[THINK]``/``[/THINK]`` for a thought, ``[ARGS]``/``[CALL_ID]`` for v11+ calls); the tiny model's own
    template is this one, byte for byte."""
    return _renderer(tiny_family_model, "magistral", "magistral_small2509.jinja")


def test_magistral_always_thinks_in_think_tokens_read_by_mistral(magistral):
    """Magistral thinks as its system prompt asks ([THINK]...[/THINK], no template argument): a plain run chooses
    vLLM's ``mistral`` parsers, the prompt leaves the thought to the model, and a turn is split at [/THINK]."""
    parser = magistral.parser_for(SAMPLING)
    assert (parser.description["reasoning"], parser.description["tool"]) == ("mistral", "mistral")
    assert magistral.thinking_arg_for(SAMPLING) is None
    on_ids, on = _prompt(magistral, thinking=True, tools=WEATHER)
    off_ids, _ = _prompt(magistral, thinking=False, tools=WEATHER)
    assert on_ids == off_ids   # nothing switches it: a run accepts only "on" (tests/unit/test_thinking_switch.py)
    # With no system message of the row's, the template's default one states the protocol (Magistral's card).
    assert on.startswith("<s>[SYSTEM_PROMPT]First draft your thinking process (inner monologue)")
    assert "must follow the template below:[THINK]Your thoughts" in on and on.endswith("[/INST]")
    split, calls = _parse(magistral, on_ids, "[THINK]The user wants Paris.[/THINK]It is sunny.", thinking=True,
                          end="</s>", tools=WEATHER)
    assert (split.reasoning_content, split.content, calls.tool_calls) == ("The user wants Paris.", "It is sunny.", [])
    # A turn the model did not open with [THINK] is all answer, as vLLM's parser reads it; one cut off inside
    # its thought is all thought, reasoning cut short.
    split, _ = _parse(magistral, on_ids, "It is sunny.", thinking=True, end="</s>")
    assert (split.reasoning_content, split.content) == (None, "It is sunny.")
    split, _ = _parse(magistral, on_ids, "[THINK]Paris is", thinking=True, end=None, finish="length")
    assert (split.reasoning_content, split.content, split.truncated_in_reasoning) == ("Paris is", "", True)
    split, calls = _parse(magistral, on_ids, '[THINK]Paris, then.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
                          thinking=True, end="</s>", tools=WEATHER)
    assert split.reasoning_content == "Paris, then."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls.tool_calls] == [
        ("get_weather", {"city": "Paris"})] and not calls.errors
    # The next prompt keeps the step's thought in [THINK] and the call in v13's form, its id checked.
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "reasoning_content": "Paris, then.", "tool_calls": [
                   {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather",
                                                                        "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "abcDEF123", "content": '{"temp": 12}'}]
    _, text = _prompt(magistral, thinking=True, messages=history, tools=WEATHER)
    assert '[THINK]Paris, then.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>' in text
    assert text.endswith('[TOOL_RESULTS]{"temp": 12}[/TOOL_RESULTS]')
