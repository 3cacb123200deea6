"""The tiny model's tokenizer, chat template and builder (no vLLM, no services)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from tests.support.helpers import ROOT, wait_for
from worker.tiny import model as tiny_model

#: Builds tiny models: minutes of a 2-core machine, so the module starts first under xdist (docs/testing.md).
pytestmark = pytest.mark.slow

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Local time",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_model.train_tokenizer(tiny_model.tokenizer_corpus(0))


def render(tokenizer, messages, tools=None, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


def test_special_and_format_tokens_are_single_ids(tokenizer):
    for token in tiny_model.SPECIAL_TOKENS + tiny_model.FORMAT_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert ids == [tokenizer.convert_tokens_to_ids(token)], token
    # Inside text too: a parser can find <think> and <tool_call> by id.
    ids = tokenizer.encode("ok<think>\nx</think>\n\n<tool_call>\n{}\n</tool_call>", add_special_tokens=False)
    for token in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert tokenizer.convert_tokens_to_ids(token) in ids


def test_format_tokens_survive_decoding_but_turn_tokens_do_not(tokenizer):
    ids = tokenizer.encode("<think>\nhm\n</think>\n\nHi.<|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>\nhm\n</think>\n\nHi."


def test_tokenizer_round_trips_text_json_and_code(tokenizer):
    for text in ("Hello, world! 12.5 degrees", '{"city": "Paris", "n": [1, 2]}', "def f(x):\n    return x\n",
                 "naïve café ✓"):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_eos_and_pad_are_qwen3s(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"


def test_a_plain_conversation_renders_as_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(tokenizer, messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_thinking_off_appends_an_empty_think_block(tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    on = render(tokenizer, messages, add_generation_prompt=True, enable_thinking=True)
    off = render(tokenizer, messages, add_generation_prompt=True, enable_thinking=False)
    assert on.endswith("<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"
    # Without the flag the template behaves as thinking on, as Qwen3's does.
    assert render(tokenizer, messages, add_generation_prompt=True) == on


def test_tools_go_into_the_system_block_after_the_system_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    text = render(tokenizer, messages, tools=[WEATHER_TOOL, TIME_TOOL], add_generation_prompt=True)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(WEATHER_TOOL)}\n{json.dumps(TIME_TOOL)}\n</tools>" in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in system
    assert text.count("<|im_start|>system") == 1


def test_tools_without_a_system_prompt_still_get_a_system_block(tokenizer):
    text = render(tokenizer, [{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\n# Tools\n")


def test_an_agentic_turn_renders_calls_grouped_responses_and_current_reasoning(tokenizer):
    messages = [
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Two tools.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            # A JSON string is tolerated and passed through.
            {"type": "function", "function": {"name": "get_time", "arguments": '{"timezone": "CET"}'}}]},
        {"role": "tool", "content": '{"temp": 12}'},
        {"role": "tool", "content": "12:00"},
        {"role": "assistant", "content": "12 C at noon.", "reasoning_content": "Both came back."},
    ]
    assert render(tokenizer, messages, tools=[WEATHER_TOOL]).split("</tool_call><|im_end|>\n", 1)[1] == (
        "<|im_start|>user\nWeather and time in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo tools.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n{\"temp\": 12}\n</tool_response>\n"
        "<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nBoth came back.\n</think>\n\n12 C at noon.<|im_end|>\n")


def test_a_call_after_text_is_on_its_own_line(tokenizer):
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"function": {"name": "get_time", "arguments": {}}}]}, {"role": "user", "content": "y"}]
    assert ('<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
            "</tool_call><|im_end|>") in render(tokenizer, messages)


def test_reasoning_of_turns_before_the_last_user_query_is_dropped(tokenizer):
    messages = [
        {"role": "user", "content": "First?"},
        {"role": "assistant", "content": "One.", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "Second?"},
        {"role": "assistant", "content": "Two.", "reasoning_content": "new thoughts"},
    ]
    text = render(tokenizer, messages)
    assert "old thoughts" not in text
    assert "<|im_start|>assistant\nOne.<|im_end|>" in text
    assert "<|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\nTwo.<|im_end|>" in text


def test_inline_think_in_content_is_treated_as_reasoning(tokenizer):
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nold\n</think>\n\nA."},
                {"role": "user", "content": "b"}]
    assert "<|im_start|>assistant\nA.<|im_end|>" in render(tokenizer, messages)


def test_a_final_assistant_turn_without_reasoning_gets_an_empty_think_block(tokenizer):
    # This is what a thinking-off prompt makes the model produce, so training
    # examples rendered this way match generation.
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "A."}]
    assert render(tokenizer, messages).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nA.<|im_end|>\n")


def test_a_wrapped_tool_response_in_a_user_turn_does_not_count_as_a_query(tokenizer):
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "call it",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "user", "content": "<tool_response>\n3 C\n</tool_response>"},
    ]
    assert "<think>\ncall it\n</think>" in render(tokenizer, messages, add_generation_prompt=True)


def test_the_random_build_is_byte_for_byte_deterministic(tmp_path):
    first = tiny_model.build_tiny_model(tmp_path / "a", cache_dir=tmp_path / "cache-a")
    second = tiny_model.build_tiny_model(tmp_path / "b", cache_dir=tmp_path / "cache-b")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= set(names)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache for the tests below that build but test no first build: each build is ~10 s of a 2-core machine."""
    return tmp_path_factory.mktemp("tiny-cache")


def test_another_seed_gives_other_weights(tmp_path, shared_cache):
    a = tiny_model.build_tiny_model(tmp_path / "a", seed=0, cache_dir=shared_cache)
    b = tiny_model.build_tiny_model(tmp_path / "b", seed=1, cache_dir=shared_cache)
    assert (a / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()


def test_the_built_directory_loads_offline_with_the_expected_config(tmp_path, shared_cache):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    out = tiny_model.build_tiny_model(tmp_path / "m", cache_dir=shared_cache)
    config = AutoConfig.from_pretrained(out, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    gen = GenerationConfig.from_pretrained(out, local_files_only=True)
    assert config.model_type == "qwen3" and config.head_dim == 64
    assert config.max_position_embeddings >= 8192
    assert config.vocab_size == len(tok)
    assert gen.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    assert (gen.temperature, gen.top_p, gen.top_k) == (0.6, 0.95, 20)
    # The template travels inside tokenizer_config.json, not as a side file.
    assert "chat_template" in json.loads((out / "tokenizer_config.json").read_text())
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_a_second_build_reuses_the_directory_and_force_replaces_it(tmp_path, shared_cache):
    out = tiny_model.build_tiny_model(tmp_path / "m", cache_dir=shared_cache)
    (out / "extra.txt").write_text("left by a user")
    assert tiny_model.build_tiny_model(out, cache_dir=shared_cache) == out
    assert (out / "extra.txt").exists()
    tiny_model.build_tiny_model(out, force=True, cache_dir=shared_cache)
    assert not (out / "extra.txt").exists()


def test_a_directory_with_other_content_is_never_overwritten(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        tiny_model.build_tiny_model(tmp_path, force=True, cache_dir=tmp_path / "cache")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_another_build_in_the_directory_needs_force(tmp_path, shared_cache):
    out = tiny_model.build_tiny_model(tmp_path / "m", seed=0, cache_dir=shared_cache)
    with pytest.raises(FileExistsError):
        tiny_model.build_tiny_model(out, seed=1, cache_dir=shared_cache)
    tiny_model.build_tiny_model(out, seed=1, force=True, cache_dir=shared_cache)


def _waiting_for_a_lock(pid: int) -> bool:
    """Whether ``pid`` is blocked on a file lock (the kernel lists such waiters with ``->`` in /proc/locks)."""
    return any(line.split()[1] == "->" and line.split()[5] == str(pid)
               for line in open("/proc/locks").read().splitlines() if len(line.split()) > 5)


def test_a_build_waits_for_the_entry_being_built_elsewhere_and_then_reuses_it(tmp_path):
    """Two processes asking for one cache entry at once (two xdist workers) build it once: the second waits."""
    cache = tmp_path / "cache"
    key = tiny_model.build_key("random", 0)
    entry = cache / f"random-0-{key}"
    code = ("import sys; from worker.tiny.model import build_tiny_model; "
            "build_tiny_model(sys.argv[1], cache_dir=sys.argv[2])")
    with tiny_model.entry_lock(entry):
        child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "m"), str(cache)], cwd=ROOT)
        try:
            wait_for(lambda: _waiting_for_a_lock(child.pid) or child.poll() is not None, timeout_s=120,
                     what="the second build waiting for the entry's lock", interval_s=0.1)
            assert child.poll() is None, "the second build did not wait for the first"
            # What the lock's holder leaves: a complete entry (a marker is what a build checks).
            entry.mkdir()
            (entry / tiny_model.MARKER_FILE).write_text(json.dumps({"variant": "random", "seed": 0, "key": key}))
            (entry / "made-by-the-first.txt").write_text("1")
        except BaseException:
            child.kill()
            raise
    assert child.wait(timeout=120) == 0
    # Copied from the entry the first left, not built again.
    assert (tmp_path / "m" / "made-by-the-first.txt").exists()
    assert not (tmp_path / "m" / "model.safetensors").exists()


def test_an_unknown_variant_is_refused(tmp_path):
    with pytest.raises(ValueError, match="variant"):
        tiny_model.build_tiny_model(tmp_path / "m", variant="huge")  # type: ignore[arg-type]


# --- the synthetic training data ---------------------------------------------------------------


def examples(count: int, seed: int = 0, **kwargs):
    from worker.tiny import data as tiny_data

    rng = random.Random(seed)
    return [tiny_data.synthetic_example(rng, **kwargs) for _ in range(count)]


def test_synthetic_examples_are_deterministic_for_a_seed():
    assert examples(50, seed=3) == examples(50, seed=3)
    assert examples(50, seed=3) != examples(50, seed=4)


def test_every_kind_of_turn_is_in_the_training_data():
    turns = examples(300)
    last = [ex.messages[-1] for ex in turns]
    assert any(ex.enable_thinking for ex in turns) and not all(ex.enable_thinking for ex in turns)
    assert any(len(m.get("tool_calls") or []) == 2 for m in last)
    assert any(m["role"] == "tool" for ex in turns for m in ex.messages)
    assert any(m.get("tool_calls") is None and m.get("reasoning_content") for m in last)
    for ex, m in zip(turns, last, strict=True):
        offered = {t["function"]["name"] for t in ex.tools or []}
        assert {c["function"]["name"] for c in m.get("tool_calls") or []} <= offered


def test_answer_lengths_are_long_tailed():
    lengths = sorted(len(ex.messages[-1]["content"].split()) for ex in examples(2000)
                     if not ex.tools and ex.messages[-1]["content"])
    median = lengths[len(lengths) // 2]
    assert lengths[-1] > 10 * median


def test_a_rendered_example_is_the_generation_prompt_then_the_turn(tokenizer):
    from worker.tiny import data as tiny_data

    for ex in examples(60):
        ids, prompt_len = tiny_data.render_example(tokenizer, ex)
        prompt = tokenizer.apply_chat_template(ex.messages[:-1], tools=ex.tools, add_generation_prompt=True,
                                               enable_thinking=ex.enable_thinking, tokenize=False)
        assert ids[:prompt_len] == tokenizer.encode(prompt, add_special_tokens=False)
        assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        completion = tokenizer.decode(ids[prompt_len:])
        assert completion.startswith("<think>\n") == ex.enable_thinking
        assert ("<tool_call>" in completion) == bool(ex.messages[-1].get("tool_calls"))


def test_stub_examples_always_answer_ok(tokenizer):
    from worker.tiny import data as tiny_data

    for ex in examples(30, stub=True):
        ids, prompt_len = tiny_data.render_example(tokenizer, ex)
        expected = "<think>\n\n</think>\n\nOK.<|im_end|>" if ex.enable_thinking else "OK.<|im_end|>"
        assert tokenizer.decode(ids[prompt_len:]) == expected


def test_training_is_deterministic_for_a_seed(tokenizer):
    import torch

    from worker.tiny import training as tiny_training

    plan = tiny_training.TrainingPlan(steps=3, batch_tokens=1024, warmup_steps=1)
    first = tiny_training.train_model(tokenizer, variant="trained", seed=0, plan=plan).state_dict()
    second = tiny_training.train_model(tokenizer, variant="trained", seed=0, plan=plan).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
