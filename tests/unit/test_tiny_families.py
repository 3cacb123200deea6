"""The tiny llama3, deepseek_r1 and glm45 models: tokens, templates, round trips, builds (no vLLM).

kimi_k2 and mistral: test_tiny_kimi_mistral.py."""

from __future__ import annotations

import json
import random

import pytest

from worker.tiny import FAMILIES
from worker.tiny import family_model as fm
from worker.tiny import model as qwen3_model
from worker.tiny.families import SPECS

#: Builds tiny models: minutes of a 2-core machine, so the module starts first under xdist (docs/testing.md).
pytestmark = pytest.mark.slow

NEW_FAMILIES = ("llama3", "deepseek_r1", "glm45")

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

#: A conversation in regen's normalised form: a tool-using step, then a second question.
AGENTIC = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Call the tool.", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": '{"temp": 12}'},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 3}'},
    {"role": "assistant", "content": "12 C in Paris.", "reasoning_content": "Both came back."},
    {"role": "user", "content": "Thanks. And Rome?"},
]


@pytest.fixture(scope="module")
def tokenizers():
    return {name: fm.train_tokenizer(SPECS[name], fm.tokenizer_corpus(SPECS[name], 0)) for name in NEW_FAMILIES}


def render(tok, messages, tools=None, **kwargs) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


# --- the table and the tokens ------------------------------------------------------------------


def test_the_families_table_names_the_vllm_parsers():
    assert FAMILIES == {
        "qwen3": {"reasoning_parser": "qwen3", "tool_parser": "hermes"},
        "llama3": {"reasoning_parser": None, "tool_parser": "llama3_json"},
        "deepseek_r1": {"reasoning_parser": "deepseek_r1", "tool_parser": "deepseek_v3"},
        "glm45": {"reasoning_parser": "glm45", "tool_parser": "glm45"},
        "kimi_k2": {"reasoning_parser": "kimi_k2", "tool_parser": "kimi_k2"},
        "mistral": {"reasoning_parser": None, "tool_parser": "mistral"},
        "magistral": {"reasoning_parser": "mistral", "tool_parser": "mistral"},
        # vLLM's names for gpt-oss; regen renders and reads it with Harmony (worker/tiny/harmony_model.py).
        "gpt_oss": {"reasoning_parser": "openai_gptoss", "tool_parser": "openai"},
        "qwen36": {"reasoning_parser": "qwen3", "tool_parser": "qwen3_coder"},
    }
    # The qwen3 entry describes what model.py builds.
    assert SPECS["qwen3"].special_tokens == qwen3_model.SPECIAL_TOKENS
    assert SPECS["qwen3"].format_tokens == qwen3_model.FORMAT_TOKENS
    assert SPECS["qwen3"].template_path == qwen3_model.TEMPLATE_PATH


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_special_and_format_tokens_are_single_ids(tokenizers, family):
    tok, spec = tokenizers[family], SPECS[family]
    for token in spec.all_tokens:
        assert tok.encode(token, add_special_tokens=False) == [tok.convert_tokens_to_ids(token)], token
        # Inside text too, so parsers can find them by id.
        ids = tok.encode(f"ab{token}cd", add_special_tokens=False)
        assert tok.convert_tokens_to_ids(token) in ids, token
    assert tok.eos_token == spec.eos_token and tok.pad_token == spec.pad_token


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_decoding_skips_special_tokens_and_keeps_format_tokens(tokenizers, family):
    tok, spec = tokenizers[family], SPECS[family]
    text = "Hi " + " ".join(spec.all_tokens) + " there"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    kept = tok.decode(ids, skip_special_tokens=True)
    for token in spec.special_tokens:
        assert token not in kept
    for token in spec.format_tokens:
        assert token in kept


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_the_tokenizer_round_trips_text_json_and_code(tokenizers, family):
    tok = tokenizers[family]
    for text in ('Hello, world! 12.5', '{"city": "Paris", "n": [1, 2]}', "def f(x):\n    return x\n", "naïve ✓"):
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


# --- the templates -----------------------------------------------------------------------------


def test_llama3_renders_headers_tools_in_the_first_user_message_json_calls_and_ipython(tokenizers):
    tok = tokenizers["llama3"]
    text = render(tok, AGENTIC, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                           "Environment: ipython\n\nBe brief.<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions")
    assert f"{json.dumps(WEATHER_TOOL)}\n\nWeather in Paris?<|eot_id|>" in text
    assert text.count(json.dumps(WEATHER_TOOL)) == 1  # only in the first user message
    assert text.split("Weather in Paris?<|eot_id|>", 1)[1] == (
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 12}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 3}<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n12 C in Paris.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nThanks. And Rome?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    # No thinking: reasoning is never rendered and the flag changes nothing.
    assert "Call the tool." not in text and "<think>" not in text
    for flag in (True, False):
        assert render(tok, AGENTIC, tools=[WEATHER_TOOL], add_generation_prompt=True, enable_thinking=flag) == text


def test_llama3_without_tools_or_system_has_no_system_block(tokenizers):
    assert render(tokenizers["llama3"], [{"role": "user", "content": "Hi"}], add_generation_prompt=True) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_deepseek_r1_renders_calls_outputs_and_thoughts_of_the_current_step(tokenizers):
    tok = tokenizers["deepseek_r1"]
    text = render(tok, AGENTIC[:-1], tools=[WEATHER_TOOL])
    assert text.startswith("<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\n\n")
    assert f"\n{json.dumps(WEATHER_TOOL)}\n" in text
    assert text.split("<｜User｜>", 1)[1] == (
        "Weather in Paris?<｜Assistant｜><think>\nCall the tool.\n</think>\n\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n'
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Oslo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
        '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{"temp": 12}<｜tool▁output▁end｜>\n'
        '<｜tool▁output▁begin｜>{"temp": 3}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>'
        "<｜Assistant｜><think>\nBoth came back.\n</think>\n\n12 C in Paris.<｜end▁of▁sentence｜>")


def test_deepseek_r1_always_thinks_and_drops_thoughts_before_the_last_user_message(tokenizers):
    tok = tokenizers["deepseek_r1"]
    text = render(tok, AGENTIC, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert "Call the tool." not in text and "Both came back." not in text
    assert "<｜Assistant｜><｜tool▁calls▁begin｜>" in text
    assert "<｜Assistant｜>12 C in Paris.<｜end▁of▁sentence｜><｜User｜>Thanks. And Rome?" in text
    assert text.endswith("<｜User｜>Thanks. And Rome?<｜Assistant｜><think>\n")
    for flag in (True, False):  # R1 has no switch: the flag is ignored
        assert render(tok, AGENTIC, tools=[WEATHER_TOOL], add_generation_prompt=True, enable_thinking=flag) == text


def test_glm45_renders_the_tools_block_xml_calls_observations_and_thoughts(tokenizers):
    tok = tokenizers["glm45"]
    text = render(tok, AGENTIC[:-1], tools=[WEATHER_TOOL])
    assert text.startswith("[gMASK]<sop><|system|>\n# Tools\n")
    assert f"<tools>\n{json.dumps(WEATHER_TOOL)}\n</tools>" in text
    assert text.split("</tool_call><|system|>\n", 1)[1] == (
        "Be brief.<|user|>\nWeather in Paris?<|assistant|>\n<think>Call the tool.</think>\n"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"
        '<|observation|>\n<tool_response>\n{"temp": 12}\n</tool_response>\n<tool_response>\n{"temp": 3}\n'
        "</tool_response><|assistant|>\n<think>Both came back.</think>\n12 C in Paris.")


def test_glm45_values_other_than_strings_are_json_and_old_thoughts_become_empty_blocks(tokenizers):
    tok = tokenizers["glm45"]
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "reasoning_content": "old",
                 "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"n": 3, "l": [1]}}}]},
                {"role": "user", "content": "y"}]
    text = render(tok, messages, add_generation_prompt=True)
    assert ("<|assistant|>\n<think></think>\n<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n"
            "<arg_key>l</arg_key>\n<arg_value>[1]</arg_value>\n</tool_call><|user|>\ny<|assistant|>") in text
    assert "old" not in text


def test_glm45_thinking_off_puts_the_empty_block_in_the_generation_prompt(tokenizers):
    tok = tokenizers["glm45"]
    messages = [{"role": "user", "content": "Hi"}]
    on = render(tok, messages, add_generation_prompt=True, enable_thinking=True)
    assert on == "[gMASK]<sop><|user|>\nHi<|assistant|>"
    assert render(tok, messages, add_generation_prompt=True) == on
    assert render(tok, messages, add_generation_prompt=True, enable_thinking=False) == on + "\n<think></think>"


@pytest.mark.parametrize("family", ["deepseek_r1", "glm45"])
def test_inline_think_in_content_is_taken_as_reasoning(tokenizers, family):
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nold\n</think>\n\nA."},
                {"role": "user", "content": "b"}]
    text = render(tokenizers[family], messages)
    assert "old" not in text and "A." in text


# --- round trips: the next prompt extends the previous prompt with the generated turn ----------

#: What each family's model writes for AGENTIC's two assistant turns (thinking on), end token included.
GENERATED = {
    "llama3": ['{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>',
               "12 C in Paris.<|eot_id|>"],
    "deepseek_r1": ["Call the tool.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                    'get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function'
                    '<｜tool▁sep｜>get_weather\n```json\n{"city": "Oslo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
                    "<｜end▁of▁sentence｜>",
                    "Both came back.\n</think>\n\n12 C in Paris.<｜end▁of▁sentence｜>"],
    "glm45": ["\n<think>Call the tool.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
              "<arg_value>Paris</arg_value>\n</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
              "<arg_value>Oslo</arg_value>\n</tool_call><|observation|>",
              "\n<think>Both came back.</think>\n12 C in Paris.<|user|>"],
}


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_rendering_a_generated_turn_back_reproduces_it(tokenizers, family):
    tok, spec = tokenizers[family], SPECS[family]
    calls_turn, answer_turn = GENERATED[family]
    assert calls_turn.endswith(spec.turn_end(AGENTIC[2])) and answer_turn.endswith(spec.turn_end(AGENTIC[5]))

    # Within a step: the prompt after the tool results extends the call turn's prompt with the turn.
    prompt = render(tok, AGENTIC[:2], tools=[WEATHER_TOOL], add_generation_prompt=True)
    following = render(tok, AGENTIC[:5], tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert following.startswith(prompt + calls_turn), (prompt, following)
    # Token for token too: the prompt and the turn tokenized apart, as the engine has them.
    ids = tok.encode(prompt, add_special_tokens=False) + tok.encode(calls_turn, add_special_tokens=False)
    assert tok.encode(following, add_special_tokens=False)[:len(ids)] == ids

    # A conversation that ends with the answer renders as its prompt and the turn (GLM's
    # turn ends with the next role token, which the next message writes).
    prompt = render(tok, AGENTIC[:5], tools=[WEATHER_TOOL], add_generation_prompt=True)
    full = render(tok, AGENTIC[:6], tools=[WEATHER_TOOL])
    assert full + ("" if spec.template_ends_turn else spec.turn_end(AGENTIC[5])) == prompt + answer_turn

    # Across the next user message each family's rule: llama3 (no thoughts) keeps extending;
    # deepseek_r1 and glm45 drop the finished step's thoughts.
    after = render(tok, AGENTIC, tools=[WEATHER_TOOL], add_generation_prompt=True)
    if family == "llama3":
        assert after.startswith(prompt + answer_turn)
    else:
        assert not after.startswith(prompt + answer_turn)
        assert "Call the tool." not in after and "Both came back." not in after
        assert after.startswith(render(tok, AGENTIC[:2], tools=[WEATHER_TOOL], add_generation_prompt=True)
                                .removesuffix("<｜Assistant｜><think>\n"))


def test_glm45_thinking_off_turns_round_trip(tokenizers):
    tok = tokenizers["glm45"]
    messages = [{"role": "user", "content": "Hi"}]
    prompt = render(tok, messages, add_generation_prompt=True, enable_thinking=False)
    turn = "\nHello.<|user|>"
    history = messages + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More?"}]
    assert render(tok, history, add_generation_prompt=True, enable_thinking=False).startswith(prompt + turn)


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_training_examples_are_the_generation_prompt_then_the_turn(tokenizers, family):
    tok, spec = tokenizers[family], SPECS[family]
    rng = random.Random(0)
    for _ in range(60):
        example = fm.family_example(spec, rng)
        ids, prompt_len = fm.render_example(spec, tok, example)
        prompt = render(tok, example.messages[:-1], tools=example.tools, add_generation_prompt=True,
                        enable_thinking=example.enable_thinking)
        assert ids[:prompt_len] == tok.encode(prompt, add_special_tokens=False)
        last = example.messages[-1]
        assert ids[-1] == tok.convert_tokens_to_ids(spec.turn_end(last))
        completion = tok.decode(ids[prompt_len:])
        if family == "deepseek_r1":
            assert example.enable_thinking and "\n</think>\n\n" in completion
        if family == "glm45":
            assert completion.startswith("\n<think>") == example.enable_thinking
        if family == "llama3":
            assert "<think>" not in completion
        for call in last.get("tool_calls") or []:
            assert call["function"]["name"] in completion
        # The normalised form: ids on calls, tool results naming their call.
        for message in example.messages:
            assert all(call["id"] for call in message.get("tool_calls") or [])
            if message["role"] == "tool":
                assert message["tool_call_id"].startswith("call_") and message["name"]


#: The stub variant's one answer, as each family writes it (glm45: thinking on, off).
STUB_TURNS = {"llama3": {"OK.<|eot_id|>"}, "deepseek_r1": {"\n</think>\n\nOK.<｜end▁of▁sentence｜>"},
              "glm45": {"\n<think></think>\nOK.<|user|>", "\nOK.<|user|>"}}


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_stub_examples_answer_ok_in_the_family_format(tokenizers, family):
    rng = random.Random(0)
    turns = {fm.completion_text(SPECS[family], tokenizers[family], fm.family_example(SPECS[family], rng, stub=True))[1]
             for _ in range(30)}
    assert turns == STUB_TURNS[family]


# --- build keys and builds ---------------------------------------------------------------------


def test_build_keys_differ_per_family_and_qwen3s_is_models():
    keys = {family: fm.build_key(family, "trained", 0) for family in SPECS}
    assert len(set(keys.values())) == len(keys)
    for variant in qwen3_model.VARIANTS:
        assert fm.build_key("qwen3", variant, 0) == qwen3_model.build_key(variant, 0)
        assert fm.build_key("llama3", variant, 0) != fm.build_key("llama3", variant, 1)
    assert len({fm.build_key("glm45", v, 0) for v in qwen3_model.VARIANTS}) == 3


def cache_entries(cache) -> list[str]:
    """The built models in a cache folder (not the lock files beside them: worker/tiny/model.py entry_lock)."""
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))


def test_the_qwen3_family_is_the_unchanged_builder(tmp_path):
    out = fm.build_tiny_model(tmp_path / "m", family="qwen3", cache_dir=tmp_path / "cache")
    assert cache_entries(tmp_path / "cache") == [f"random-0-{qwen3_model.build_key('random', 0)}"]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == qwen3_model.TEMPLATE_PATH.read_text()


#: What a caller can recognise each family by, in the template of tokenizer_config.json.
MARKERS = {"llama3": "<|start_header_id|>", "deepseek_r1": "<｜tool▁calls▁begin｜>", "glm45": "<arg_key>"}


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_a_random_build_loads_offline_and_carries_its_template(tmp_path, family):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    spec = SPECS[family]
    out = fm.build_tiny_model(tmp_path / "m", family=family, cache_dir=tmp_path / "cache")
    assert cache_entries(tmp_path / "cache") == [f"{family}-random-0-{fm.build_key(family, 'random', 0)}"]
    template = json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    assert template == spec.template_path.read_text()
    for other, marker in MARKERS.items():
        assert (marker in template) == (other == family), other
    config = AutoConfig.from_pretrained(out, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    gen = GenerationConfig.from_pretrained(out, local_files_only=True)
    assert config.head_dim >= 32 and config.vocab_size == len(tok)
    assert gen.eos_token_id == tok.convert_tokens_to_ids(list(spec.stop_tokens))
    assert config.eos_token_id == tok.convert_tokens_to_ids(spec.eos_token)
    # Special tokens keep their flag through save and load.
    ids = tok.encode("x" + "".join(spec.all_tokens), add_special_tokens=False)
    assert len(ids) == 1 + len(spec.all_tokens)
    assert tok.decode(ids, skip_special_tokens=True) == "x" + "".join(spec.format_tokens)
    # Deterministic: a second build elsewhere writes the same bytes.
    again = fm.build_tiny_model(tmp_path / "n", family=family, cache_dir=tmp_path / "cache-2")
    for path in out.iterdir():
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name


def test_an_unknown_family_or_variant_is_refused(tmp_path):
    with pytest.raises(ValueError, match="family"):
        fm.build_tiny_model(tmp_path / "m", family="gpt2")
    with pytest.raises(ValueError, match="variant"):
        fm.build_tiny_model(tmp_path / "m", family="glm45", variant="huge")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """``REGEN_CACHE_DIR`` for the tests below, which build but test no first build (a family build is
    ~30-170 s of a shared 2-core machine): its ``tiny-models`` folder is the cache."""
    return tmp_path_factory.mktemp("tiny-cache")


def test_another_family_in_the_directory_needs_force(tmp_path, shared_cache):
    cache = shared_cache / "tiny-models"
    out = fm.build_tiny_model(tmp_path / "m", family="llama3", cache_dir=cache)
    assert fm.build_tiny_model(out, family="llama3", cache_dir=cache) == out
    with pytest.raises(FileExistsError, match="llama3"):
        fm.build_tiny_model(out, family="glm45", cache_dir=cache)
    fm.build_tiny_model(out, family="glm45", force=True, cache_dir=cache)
    assert json.loads((out / qwen3_model.MARKER_FILE).read_text())["family"] == "glm45"


def test_the_cli_builds_a_family(tmp_path, monkeypatch, shared_cache):
    from click.testing import CliRunner

    from producer.cli import main

    monkeypatch.setenv("REGEN_CACHE_DIR", str(shared_cache))
    result = CliRunner().invoke(main, ["tiny-model", str(tmp_path / "m"), "--variant", "random", "--family", "llama3"])
    assert result.exit_code == 0, result.output
    assert "tiny llama3 model (random)" in result.output
    marker = json.loads((tmp_path / "m" / qwen3_model.MARKER_FILE).read_text())
    assert (marker["family"], marker["variant"]) == ("llama3", "random")
    # Every family is offered; an unknown one is refused by click.
    assert CliRunner().invoke(main, ["tiny-model", str(tmp_path / "n"), "--family", "gpt2"]).exit_code == 2
    help_text = CliRunner().invoke(main, ["tiny-model", "--help"]).output
    assert all(name in help_text for name in SPECS)


def test_regen_tiny_model_offers_every_family_the_table_builds():
    import click

    from producer.cli import main
    from worker.tiny.families import SPECS

    family = next(p for p in main.commands["tiny-model"].params if p.name == "family")
    assert isinstance(family.type, click.Choice)
    assert sorted(family.type.choices) == sorted(SPECS)
