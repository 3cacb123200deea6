"""Faithful to the target: every prompt the engine saw is the model's own rendering, turn by turn.

Runs the bundled conversations (system prompts, multi-turn, single, multiple and
parallel tool calls) through the shared engine with thinking on, off and mixed,
exactly as a worker does (worker.conversation.generation.generate_batch), then checks each
generation event against an independent transformers rendering.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ledger.hashing import sample_seed
from producer.dataset.normalize import normalize_row
from tests.support.fidelity import assert_prompts_are_fresh_renderings

pytestmark = pytest.mark.engine

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"


def _conversations(limit_per_file: int = 12) -> list[dict]:
    out = []
    for name in ("openai_chat.jsonl", "tools.jsonl"):
        with (SAMPLE / name).open() as f:
            for i, line in enumerate(f):
                if i >= limit_per_file:
                    break
                sample = normalize_row(json.loads(line))
                sample["source"] = {"file": name, "row": i + 1}
                out.append(sample)
    return out


def _run(engine_host, renderer, samples, *, thinking: str, off_share: float = 0.0, max_tokens: int = 192):
    from worker.conversation.generation import generate_batch

    run = {"id": 1, "name": "fidelity", "model": engine_host.model, "config_hash": "x" * 64,
           "provenance": {"engine": engine_host.engine_version, "chat_template_sha256": renderer.template_hash},
           "sampling": {"temperature": 0.8, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0,
                        "max_tokens": max_tokens, "seed": 11, "thinking": thinking, "thinking_off_share": off_share}}
    return engine_host.submit(generate_batch(engine_host, renderer, samples, run)).result(timeout=900)


@pytest.fixture(scope="module")
def fresh_tokenizer(engine_host):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(engine_host.model)


@pytest.fixture(scope="module")
def rows(engine_host, renderer):
    samples = _conversations()
    return {"on": _run(engine_host, renderer, samples, thinking="on"),
            "off": _run(engine_host, renderer, samples, thinking="off"),
            "mix": _run(engine_host, renderer, samples, thinking="mix", off_share=0.5)}


def test_every_prompt_is_a_fresh_transformers_rendering_of_its_context(rows, fresh_tokenizer):
    checked = sum(assert_prompts_are_fresh_renderings(mode_rows, fresh_tokenizer) for mode_rows in rows.values())
    assert checked >= 3 * 24


def test_loss_masks_cover_exactly_the_generated_ids(rows):
    for row in rows["on"] + rows["off"]:
        for event in row["events"]:
            prompt, completion = event["prompt_token_ids"], event["completion_token_ids"]
            assert event["loss_mask"] == [0] * len(prompt) + [1] * len(completion)
            assert event["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(completion)}


def test_every_row_names_the_template_hash_and_a_reproducible_seed(rows, fresh_tokenizer):
    template_hash = hashlib.sha256(fresh_tokenizer.chat_template.encode()).hexdigest()
    for row in rows["on"]:
        assert row["provenance"]["chat_template_sha256"] == template_hash
        assert row["provenance"]["engine"].startswith("vllm ")
        assert row["sampling"]["seed"] == sample_seed(11, row["sample_id"], 0)
        # The run named no parsers (recorded before regen chose them): the template's, read by vLLM's classes.
        assert row["parser"] == {"reasoning": "qwen3", "tool": "hermes", "by": row["provenance"]["engine"]}


def test_thinking_off_prompts_end_with_the_empty_think_block_and_have_no_reasoning(rows, fresh_tokenizer):
    empty_think = fresh_tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    for row in rows["off"]:
        assert row["thinking"] is False
        for event in row["events"]:
            assert event["prompt_token_ids"][-len(empty_think):] == empty_think
        for message in row["messages"]:
            if message["role"] == "assistant":
                assert not message.get("reasoning_content")


def test_a_mixed_run_uses_both_modes_stably_per_sample(rows):
    modes = {row["sample_id"]: row["thinking"] for row in rows["mix"]}
    assert set(modes.values()) == {True, False}
    again = {row["sample_id"]: row["thinking"] for row in rows["mix"]}
    assert modes == again


def test_multi_turn_conversations_get_one_event_per_assistant_turn(rows):
    complete = 0
    for row in rows["on"]:
        if row["tools"]:
            continue
        source_turns = sum(m["role"] == "assistant" for m in row["input_messages"])
        final = 1 if row["input_messages"][-1]["role"] != "assistant" else 0
        if row["stop_reason"] is None:
            assert len(row["events"]) == source_turns + final, row["sample_id"]
            complete += 1
        else:  # stopped early (truncated): every event so far is kept, in order
            assert [e["turn"] for e in row["events"]] == list(range(len(row["events"])))
    # The trained model stops: most multi-turn chats are regenerated turn by turn to the end.
    assert complete >= 6, complete


def test_regenerated_tool_calls_are_parsed_and_the_source_results_spliced_after_them(rows):
    """Tool rows: each regenerated call is structured; the source's results follow it in order, or it ends the row."""
    spliced = 0
    for row in rows["on"] + rows["off"]:
        if not row["tools"]:
            continue
        messages = row["messages"]
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or not message.get("tool_calls"):
                continue
            for call in message["tool_calls"]:
                assert isinstance(call["function"]["arguments"], dict), call  # a JSON object (docs/formats.md)
            results = []
            for follower in messages[i + 1:]:
                if follower["role"] != "tool":
                    break
                results.append(follower)
            if results:
                # Matched by name and order: one result per call, answering that call's id.
                assert [r["tool_call_id"] for r in results] == [c["id"] for c in message["tool_calls"]]
                # A name only where the source's result has one (an OpenAI request's form), and then the call's.
                names = [c["function"]["name"] for c in message["tool_calls"]]
                assert [r.get("name", n) for r, n in zip(results, names, strict=True)] == names
                spliced += 1
            else:
                # Nothing spliced: the conversation ends here (the calls no longer match the
                # source's results, and stop_reason says so, or this was the last turn).
                assert message is messages[-1]
    assert spliced >= 4, spliced
    print(f"tool turns with spliced results: {spliced}")
