"""gpt-oss through Harmony: the published template is recognised, a run records the Harmony path, prompts are
Harmony's own encoding, turns are read by Harmony's parser, and no mode without reasoning is accepted."""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.errors import ConfigError
from tests.support.harmony import DATE, reference_head

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
GPT_OSS = TEMPLATES / "gpt_oss.jinja"
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "call_0_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
#: A conversation as regen holds it after one turn: a thought, one call, its spliced result.
AFTER_CALL = [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": "Weather in Oslo?"},
              {"role": "assistant", "content": "", "reasoning_content": "I should call get_weather.",
               "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_0_0", "name": "get_weather", "content": '{"temp": 3}'}]


def _model_dir(tmp_path: Path, template: Path) -> Path:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template.read_text()}))
    return tmp_path


def test_the_published_gpt_oss_template_is_found_to_be_harmonys_family():
    from targets.template_probe import probe_template

    found = probe_template(GPT_OSS.read_text())
    assert (found.family, found.chat_format) == ("gpt_oss", "harmony")
    assert (found.reasoning, found.tool, found.thinking_arg) == ("openai_gptoss", "openai", "reasoning_effort")
    assert found.modes() == ("on",)


def test_a_plain_run_config_on_the_published_template_records_the_harmony_path(tmp_path, monkeypatch):
    from producer.run_config import build_run_config

    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", DATE)
    config = build_run_config(str(_model_dir(tmp_path, GPT_OSS)), max_tokens=64)
    record = config.as_record()
    assert (record["chat_format"], record["reasoning_effort"], record["thinking"]) == ("harmony", "medium", "on")
    assert (record["reasoning_parser"], record["tool_parser"]) == ("openai_gptoss", "openai")
    assert config.parsers.chosen_by == "template: gpt_oss, rendered with Harmony"
    assert config.provenance()["harmony_start_date"] == DATE
    # The date is provenance, not config: the same run submitted another day keeps its hash (and its date).
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", "2027-01-01")
    assert build_run_config(str(tmp_path), max_tokens=64).hash == config.hash
    assert build_run_config(str(tmp_path), max_tokens=64, reasoning_effort="high").hash != config.hash


def test_without_the_pin_a_run_takes_the_submit_days_date(tmp_path, monkeypatch):
    from producer.run_config import build_run_config

    monkeypatch.delenv("VLLM_SYSTEM_START_DATE", raising=False)
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert build_run_config(str(_model_dir(tmp_path, GPT_OSS)), max_tokens=8).harmony_start_date == today
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", "tomorrow")
    with pytest.raises(ConfigError, match="VLLM_SYSTEM_START_DATE='tomorrow' is not a YYYY-MM-DD date"):
        build_run_config(str(tmp_path), max_tokens=8)


@pytest.mark.parametrize(("options", "reason"), [
    ({"thinking": "off"}, "always reasons"),
    ({"thinking": "mix"}, "always reasons"),
    ({"reasoning_effort": "none"}, "no mode without reasoning"),
    ({"reasoning_parser": "qwen3"}, "vLLM reads with Harmony"),
])
def test_harmony_has_no_mode_without_reasoning_and_takes_only_its_own_parsers(tmp_path, options, reason):
    from producer.run_config import build_run_config

    with pytest.raises(ConfigError, match=reason):
        build_run_config(str(_model_dir(tmp_path, GPT_OSS)), max_tokens=8, **options)


def test_a_reasoning_effort_for_a_template_without_harmony_is_refused(tmp_path):
    from producer.run_config import build_run_config

    with pytest.raises(ConfigError, match="--reasoning-effort is Harmony's"):
        build_run_config(str(_model_dir(tmp_path, TEMPLATES / "qwen3.jinja")), max_tokens=8, reasoning_effort="low")


def test_a_gpt_oss_config_is_rendered_with_harmony_whatever_its_template(tmp_path):
    from producer.run_config import build_run_config

    model = _model_dir(tmp_path, TEMPLATES / "qwen3.jinja")
    (model / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    config = build_run_config(str(model), max_tokens=8)
    assert config.chat_format == "harmony" and config.parsers.reasoning == "openai_gptoss"


# --- rendering ---------------------------------------------------------------------------------


def _harmony_reference(messages: list, *, effort: str = "medium", instructions: str | None = None,
                       tools: list | None = None) -> list[int]:
    """openai_harmony's own rendering, built message by message (no vLLM, no regen): the reference head
    (tests/support/harmony.py), then ``messages``, rendered by Harmony's encoding."""
    from openai_harmony import Conversation, HarmonyEncodingName, Role, load_harmony_encoding

    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    head = reference_head(effort=effort, instructions=instructions, tools=tools, date=DATE)
    return enc.render_conversation_for_completion(Conversation.from_messages(head + messages), Role.ASSISTANT)


def test_a_prompt_is_harmonys_own_encoding_of_the_conversation():
    from openai_harmony import Message, Role

    from targets.harmony import render_prompt

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]
    ids = render_prompt(chat, [TOOL], effort="low", date=DATE)
    user = Message.from_role_and_content(Role.USER, "Weather in Oslo?")
    assert ids == _harmony_reference([user], effort="low", instructions="Be brief.", tools=[TOOL])
    # A second question: the first answer's thought is dropped once its final answer is in (vLLM's rule).
    chat += [{"role": "assistant", "content": "Cold.", "reasoning_content": "Oslo is north."},
             {"role": "user", "content": "And Rome?"}]
    answered = [user, Message.from_role_and_content(Role.ASSISTANT, "Cold.").with_channel("final"),
                Message.from_role_and_content(Role.USER, "And Rome?")]
    assert render_prompt(chat, None, effort="high", date=DATE) == _harmony_reference(
        answered, effort="high", instructions="Be brief.")


def test_after_a_call_the_prompt_carries_the_thought_the_call_and_its_result_as_vllm_renders_them():
    from targets.harmony import encoding, render_prompt

    text = encoding().decode(render_prompt(AFTER_CALL, [TOOL], effort="medium", date=DATE))
    assert text.endswith(
        "<|start|>user<|message|>Weather in Oslo?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>I should call get_weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
        '<|start|>functions.get_weather<|channel|>commentary to=assistant<|message|>{"temp": 3}<|end|>'
        "<|start|>assistant")
    assert f"Current date: {DATE}\n\nReasoning: medium" in text and "# Instructions\n\nBe brief." in text


def test_the_published_template_differs_from_harmony_after_a_tool_call():
    """Why regen does not render gpt-oss with its Jinja template: the tool result's header and quoting differ
    (and the template's date is today's, whatever the run recorded)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from targets.harmony import encoding, render_prompt

    chat = [{**m, "thinking": m["reasoning_content"]} if m.get("reasoning_content") else m for m in AFTER_CALL]
    (jinja,), _ = render_jinja_template(conversations=[chat], tools=[TOOL], chat_template=GPT_OSS.read_text(),
                                        add_generation_prompt=True, reasoning_effort="medium")
    today = datetime.date.today().isoformat()
    harmony = encoding().decode(render_prompt(AFTER_CALL, [TOOL], effort="medium", date=today))
    cut = '<|start|>functions.get_weather'
    assert jinja[:jinja.index(cut)] == harmony[:harmony.index(cut)]    # the same up to the tool result
    assert jinja[jinja.index(cut):] == (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"temp\\": 3}"<|end|>'
        "<|start|>assistant")
    assert harmony[harmony.index(cut):] == (
        '<|start|>functions.get_weather<|channel|>commentary to=assistant<|message|>{"temp": 3}<|end|>'
        "<|start|>assistant")


# --- reading a turn ----------------------------------------------------------------------------


def _parse(text: str, finish: str = "stop", turn: int = 0):
    from targets.harmony import HarmonyTurnParser, encoding
    from worker.conversation.dialogue import Generation

    ids = encoding().encode(text, allowed_special="all")
    stop = ids[-1] if finish == "stop" else None
    return HarmonyTurnParser().parse(Generation([], ids, finish, stop), thinking=True, tools=[TOOL], turn=turn)


def test_a_turn_is_read_into_thought_answer_and_call_by_harmonys_parser():
    split, parsed = _parse("<|channel|>analysis<|message|>Oslo is north.<|end|>"
                           "<|start|>assistant<|channel|>final<|message|>Cold.<|return|>")
    assert (split.reasoning_content, split.content, parsed.tool_calls, parsed.errors) == (
        "Oslo is north.", "Cold.", [], [])
    split, parsed = _parse("<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant to=functions.get_weather"
                           '<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>', turn=2)
    assert split.reasoning_content == "Call it." and parsed.content == ""
    assert parsed.tool_calls == [{"id": "call_2_0", "type": "function",
                                  "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    # Harmony's own header form (the recipient after the channel) reads the same.
    _, parsed = _parse("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                       '{"city": "Oslo"}<|call|>')
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["get_weather"]


def test_a_cut_off_thought_is_all_thought_and_bad_calls_are_recorded_not_dropped():
    split, parsed = _parse("<|channel|>analysis<|message|>Thinking about", finish="length")
    assert (split.reasoning_content, split.content, split.truncated_in_reasoning) == ("Thinking about", "", True)
    _, parsed = _parse('<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_weather'
                       '<|channel|>commentary json<|message|>{"city": "Os', finish="length")
    assert parsed.tool_calls == [] and parsed.unterminated
    assert parsed.errors[0]["error"] == "the call has no end (<|call|>)" and '"Os' in parsed.errors[0]["raw"]
    # The prompt ends <|start|>assistant: a turn that calls at once starts with the recipient.
    _, parsed = _parse(" to=functions.get_weather<|channel|>commentary json<|message|>[1, 2]<|call|>")
    assert "not an object" in parsed.errors[0]["error"]
    _, parsed = _parse(' to=browser.search<|channel|>analysis<|message|>{"q": 1}<|call|>')
    assert parsed.errors[0]["error"] == "a call to browser.search, not to a function"
    # A header Harmony misreads (the prompt's <|start|>assistant written again) is an error of the turn.
    _, parsed = _parse("<|start|>assistant<|channel|>final<|message|>Hi<|return|>")
    assert parsed.errors and not parsed.tool_calls


def test_every_commentary_call_of_a_turn_is_read_in_order():
    """Ids with two calls (an engine that does not stop at <|call|>): both are calls, numbered in the turn."""
    split, parsed = _parse("<|channel|>analysis<|message|>Both cities.<|end|><|start|>assistant to=functions.get_weather"
                           '<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|><|start|>assistant '
                           'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome"}<|call|>', turn=3)
    assert split.reasoning_content == "Both cities." and parsed.errors == []
    assert [(c["id"], c["function"]["arguments"]) for c in parsed.tool_calls] == [
        ("call_3_0", {"city": "Oslo"}), ("call_3_1", {"city": "Rome"})]


#: A source turn of two parallel calls, their results, and the answer after them.
PARALLEL = [{"role": "user", "content": "Weather in Oslo and Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "src_a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                {"id": "src_b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "tool_call_id": "src_a", "content": '{"temp": 3}'},
            {"role": "tool", "tool_call_id": "src_b", "content": '{"temp": 18}'},
            {"role": "assistant", "content": "Cold, then warm."}]
_CALL = ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{{"city": "{city}"}}'
         "<|call|>")


def _regenerate(actions: list[str]):
    """PARALLEL regenerated through Harmony (render_prompt, HarmonyTurnParser) with scripted completions; each
    action's text is encoded to Harmony ids, as the engine would return them after the prompt's <|start|>assistant."""
    import asyncio

    from targets.harmony import HarmonyTurnParser, encoding, render_prompt
    from worker.conversation.dialogue import Generation, regenerate_conversation

    prompts: list[list[int]] = []

    async def generate(prompt_ids, turn):
        prompts.append(prompt_ids)
        ids = encoding().encode(actions[turn], allowed_special="all")
        return Generation(prompt_ids, ids, "stop", ids[-1])

    result = asyncio.run(regenerate_conversation(
        {"sample_id": "par", "messages": PARALLEL, "tools": [TOOL]}, thinking=True, parser=HarmonyTurnParser(),
        render=lambda m, t: render_prompt(m, t, effort="medium", date=DATE), generate=generate))
    return result, [encoding().decode(p) for p in prompts]


def test_parallel_source_calls_are_made_one_action_at_a_time_and_every_result_spliced():
    """gpt-oss stops at <|call|>: the turn's second call comes in a second action, after the first call's result,
    and the answer after both; every result is the source's, re-labelled with the model's call."""
    first = "<|channel|>analysis<|message|>Oslo first.<|end|>" + _CALL.format(city="Oslo")
    result, prompts = _regenerate([first, _CALL.format(city="Rome").removeprefix("<|start|>assistant"),
                                   "<|channel|>final<|message|>Cold, then warm.<|return|>"])
    assert result.stop_reason is None and result.turns == 3 and result.tool_calls == 2
    roles = [(m["role"], m.get("tool_call_id") or [c["id"] for c in m.get("tool_calls") or []]) for m in result.messages]
    assert roles == [("user", []), ("assistant", ["call_0_0"]), ("tool", "call_0_0"), ("assistant", ["call_1_0"]),
                     ("tool", "call_1_0"), ("assistant", [])]
    assert [m["content"] for m in result.messages if m["role"] == "tool"] == ['{"temp": 3}', '{"temp": 18}']
    # The second action sees the first call and its result; the answer sees both, each result after its call.
    result_a = '<|start|>functions.get_weather<|channel|>commentary to=assistant<|message|>{"temp": 3}<|end|>'
    result_b = '<|start|>functions.get_weather<|channel|>commentary to=assistant<|message|>{"temp": 18}<|end|>'
    assert prompts[1].endswith(_CALL.format(city="Oslo") + result_a + "<|start|>assistant")
    assert prompts[2].endswith(_CALL.format(city="Oslo") + result_a + _CALL.format(city="Rome") + result_b +
                               "<|start|>assistant")
    assert "<|channel|>analysis<|message|>Oslo first.<|end|>" in prompts[2]   # a thought within the tool loop stays


def test_an_answer_before_all_the_turns_calls_stops_the_conversation_and_says_which_are_missing():
    result, _ = _regenerate([_CALL.format(city="Oslo").removeprefix("<|start|>assistant"),
                             "<|channel|>final<|message|>Cold.<|return|>"])
    assert result.stop_reason == "tool_calls_diverged: expected [get_weather] got []"
    assert result.turns == 2 and result.messages[-1]["content"] == "Cold."


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) to cut the network")
def test_harmony_loads_its_vocabulary_with_no_network_and_no_cache(tmp_path):
    """The o200k vocabulary comes with the oss-harmony wheel: no tiktoken cache, no download."""
    code = ("from openai_harmony import load_harmony_encoding as l, HarmonyEncodingName as n; "
            "print(l(n.HARMONY_GPT_OSS).encode('<|start|>assistant', allowed_special='all'))")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -n is not permitted here: {probe.stderr.decode().strip()}")
    out = subprocess.run(["unshare", "-n", sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[200006, 173781]"


def test_the_harmony_library_is_named_by_the_wheel_that_provides_it():
    """Rows and the tiny model's build key name the installed wheel: oss-harmony with vLLM 0.32 (here),
    openai-harmony with the GPU's vLLM 0.26, whose build key once asked for oss-harmony and failed there."""
    from importlib.metadata import PackageNotFoundError, version

    from targets.harmony import HARMONY_DISTRIBUTIONS, HarmonyTurnParser, harmony_library

    name, got = harmony_library()
    assert name in HARMONY_DISTRIBUTIONS
    assert got == version(name)
    for earlier in HARMONY_DISTRIBUTIONS[:HARMONY_DISTRIBUTIONS.index(name)]:
        with pytest.raises(PackageNotFoundError):
            version(earlier)
    assert HarmonyTurnParser().description["by"] == f"{name} {got}"
