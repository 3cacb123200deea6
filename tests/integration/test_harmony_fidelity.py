"""Faithful to gpt-oss: the tiny gpt-oss model (Harmony's vocabulary, gpt-oss's published template) runs through
the engine as a worker runs it, on the path ``regen submit`` chose by itself: Harmony.

Per event: its prompt ids are Harmony's reference encoding of its context (built here with openai_harmony's
own message API, rendered by vLLM's Harmony renderer as ``vllm serve`` does); the completion is read by
Harmony's parser into thought, answer and calls; the source's tool results follow the model's calls; the
next turn's prompt holds the model's own turn, id for id; loss masks are exact; and the tiny tokenizer
encodes every text as Harmony does. Plain ``regen submit`` on the published template records the Harmony
path. One engine for the module (heavy: run this file alone).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from tests.integration.test_family_fidelity import _conversations
from tests.support.harmony import DATE, reference_head
from tests.support.helpers import cli_env, run_cli

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory):
    from worker.tiny.family_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("gpt-oss") / "model", variant="trained", family="gpt_oss")


@pytest.fixture(scope="module")
def harmony_run(tiny_gpt_oss):
    """(config, run record, rows): the bundled conversations generated on the engine, as a worker does."""
    from producer.run_config import build_run_config
    from tests.fixtures.worker import TEST_ENGINE_ENV
    from worker.conversation.generation import generate_batch
    from worker.conversation.rendering import Renderer
    from worker.engine.host import EngineHost

    for key, value in TEST_ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    saved = os.environ.get("VLLM_SYSTEM_START_DATE")
    os.environ["VLLM_SYSTEM_START_DATE"] = DATE
    try:
        config = build_run_config(str(tiny_gpt_oss), max_tokens=160, seed=11)  # no flags: found by rendering
    finally:
        if saved is None:
            os.environ.pop("VLLM_SYSTEM_START_DATE")
        else:
            os.environ["VLLM_SYSTEM_START_DATE"] = saved
    host = EngineHost(model=str(tiny_gpt_oss), engine_args={"max_model_len": 4096})
    host.start()
    try:
        renderer = Renderer(host.tokenizer, host.max_model_len)
        run = {"id": 1, "name": "fid-gpt-oss", "model": host.model, "config_hash": config.hash,
               "sampling": config.as_record(),
               "provenance": {**config.provenance(), "engine": host.engine_version,
                              "chat_template_sha256": renderer.template_hash}}
        rows = host.submit(generate_batch(host, renderer, _conversations(), run)).result(timeout=900)
    finally:
        host.shutdown()
    return config, run, rows


def _events(rows):
    return [(row, row["messages"][e["message_index"]], e) for row in rows for e in row["events"]]


def _reference_messages(context: list[dict]) -> tuple[str | None, list]:
    """The context as Harmony messages, written here with openai_harmony's API (not regen's conversion)."""
    from openai_harmony import Author, Message, Role

    instructions = context[0]["content"] if context and context[0]["role"] == "system" else None
    names = {c["id"]: c["function"]["name"] for m in context for c in m.get("tool_calls") or []}
    out = []
    for m in context[1:] if instructions is not None else context:
        if m["role"] == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif m["role"] == "tool":
            out.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{names[m['tool_call_id']]}"),
                                                       m["content"]).with_channel("commentary")
                       .with_recipient("assistant"))
        elif m.get("tool_calls"):
            if m.get("content"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("commentary"))
            if m.get("reasoning_content"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"])
                           .with_channel("analysis"))
            for call in m["tool_calls"]:
                args = json.dumps(call["function"]["arguments"], ensure_ascii=False)
                out.append(Message.from_role_and_content(Role.ASSISTANT, args).with_channel("commentary")
                           .with_recipient(f"functions.{call['function']['name']}").with_content_type("json"))
        else:
            if m.get("reasoning_content"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"])
                           .with_channel("analysis"))
            if m.get("content"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("final"))
    return instructions, out


def _reference_prompt(context: list[dict], tools: list[dict] | None, effort: str) -> list[int]:
    from targets.vllm_compat import harmony_utils

    instructions, messages = _reference_messages(context)
    head = reference_head(effort=effort, instructions=instructions, tools=tools, date=DATE)
    # vLLM's renderer: Harmony's, with the analysis before the last final dropped and its tool-call headers.
    return list(harmony_utils().render_for_completion(head + messages))


def test_plain_submit_on_the_published_template_records_the_harmony_path(tiny_gpt_oss, settings, s3_env,
                                                                         s3_bucket, sessions, tmp_path):
    from sqlalchemy import text

    data = tmp_path / "a.jsonl"
    data.write_text(json.dumps({"id": "u1", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    env = {**cli_env(settings, s3_env), "VLLM_SYSTEM_START_DATE": DATE}
    out = run_cli(["submit", str(data), "--run", "p-gpt-oss", "--model", str(tiny_gpt_oss),
                   "--output", f"{s3_bucket}/p", "--queue", "nobody"], env)
    assert "parsers: reasoning openai_gptoss, tool openai (template: gpt_oss, rendered with Harmony)" in out.stdout
    assert f"rendered with Harmony (gpt-oss, as vLLM serves it): reasoning effort medium, system date {DATE}" \
        in out.stdout
    with sessions() as s:
        run = s.execute(text("SELECT sampling, provenance FROM runs WHERE name = 'p-gpt-oss'")).one()
    assert (run.sampling["chat_format"], run.sampling["reasoning_effort"]) == ("harmony", "medium")
    assert run.provenance["harmony_start_date"] == DATE
    refused = run_cli(["submit", str(data), "--run", "p-off", "--model", str(tiny_gpt_oss), "--output",
                       f"{s3_bucket}/p-off", "--queue", "nobody", "--thinking", "off"], env, check=False)
    assert refused.returncode == 2 and "Harmony, which always reasons" in refused.stderr


def test_the_tiny_models_vocabulary_is_harmonys_own(tiny_gpt_oss, harmony_run):
    from transformers import AutoTokenizer

    from targets.harmony import encoding

    _, _, rows = harmony_run
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt_oss)
    enc = encoding()
    assert len(tokenizer) == 201088
    for token, expected in (("<|start|>", 200006), ("<|channel|>", 200005), ("<|message|>", 200008),
                            ("<|end|>", 200007), ("<|call|>", 200012), ("<|return|>", 200002)):
        assert tokenizer.convert_tokens_to_ids(token) == expected
    texts = [m["content"] for row in rows for m in row["input_messages"] if isinstance(m.get("content"), str)]
    assert texts and all(tokenizer.encode(t, add_special_tokens=False) == enc.encode(t) for t in texts)


def test_every_prompt_is_harmonys_reference_encoding_and_masks_are_exact(harmony_run):
    config, run, rows = harmony_run
    assert config.chat_format == "harmony" and run["provenance"]["harmony_start_date"] == DATE
    checked = 0
    for row, _, event in _events(rows):
        assert row["status"] == "done", row.get("error")
        context = row["messages"][:event["message_index"]]
        expected = _reference_prompt(context, row["tools"], run["sampling"]["reasoning_effort"])
        assert event["prompt_token_ids"] == expected, (row["sample_id"], event["turn"])
        prompt, completion = event["prompt_token_ids"], event["completion_token_ids"]
        assert event["loss_mask"] == [0] * len(prompt) + [1] * len(completion)
        checked += 1
    assert checked >= len(rows)


def test_each_turn_is_read_by_harmonys_parser_and_rows_say_so(harmony_run):
    from targets.harmony import HARMONY_DISTRIBUTIONS, encoding

    _, _, rows = harmony_run
    enc = encoding()
    thoughts = 0
    for row, message, event in _events(rows):
        assert row["parser"]["chat_format"] == "harmony" and row["parser"]["by"].startswith(HARMONY_DISTRIBUTIONS)
        generated = enc.decode(event["completion_token_ids"])
        # Part by part: the parser joins a turn's messages of one channel with a newline.
        for part in (message.get("reasoning_content") or "", message.get("content") or ""):
            for line in filter(None, part.split("\n")):
                assert f"<|message|>{line}" in generated or line in generated, (row["sample_id"], line)
        thoughts += bool(message.get("reasoning_content"))
        for call in message.get("tool_calls") or []:
            assert f"to=functions.{call['function']['name']}" in generated
    assert thoughts >= len(rows) // 2


def test_calls_are_structured_and_the_source_results_follow_them(harmony_run):
    _, _, rows = harmony_run
    calls = spliced = 0
    for row in rows:
        if not row["tools"]:
            continue
        messages = row["messages"]
        for i, message in enumerate(messages):
            for call in message.get("tool_calls") or []:
                assert isinstance(call["function"]["arguments"], dict), call
                calls += call["function"]["name"] in {t["function"]["name"] for t in row["tools"]}
            if message.get("tool_calls") and i + 1 < len(messages) and messages[i + 1]["role"] == "tool":
                assert messages[i + 1]["tool_call_id"] == message["tool_calls"][0]["id"]
                spliced += 1
    stops = Counter((row["stop_reason"] or "complete").split(":")[0] for row in rows if row["tools"])
    assert calls >= 3, (calls, stops)
    assert spliced >= 1, (spliced, stops)


def test_a_later_turn_sees_the_models_own_turn_id_for_id(harmony_run):
    """On policy: after a call, the next prompt is the last prompt, the model's own completion, then the result."""
    _, _, rows = harmony_run
    followed = 0
    for row in rows:
        for before, after in zip(row["events"], row["events"][1:], strict=False):
            if not row["messages"][before["message_index"]].get("tool_calls"):
                continue
            seen = before["prompt_token_ids"] + before["completion_token_ids"]
            assert after["prompt_token_ids"][:len(seen)] == seen, (row["sample_id"], after["turn"])
            followed += 1
    assert followed >= 1
