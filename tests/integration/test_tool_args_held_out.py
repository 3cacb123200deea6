"""Tool results that match their calls, on the trained tiny model: mismatched calls flagged, matched ones not.

The sample's tool conversations (held out: the tiny model was trained on data/tiny's generator, not on them) run
through the worker's path (generate_batch on the session's engine) twice: as the source has them, where the tiny
model's arguments often differ from the source's ("New York" for "America/New_York"), and again, with the same
sample ids (the same seeds), with each source call's arguments rewritten to the ones the model called with in the
first pass, so its calls now match the results spliced after them. Each spliced result is checked independently
of worker/conversation/splice.py: a call whose arguments equal its source call's is never flagged, one whose
arguments differ always is, and the row and its quality class say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.quality import Thresholds, classify_sample
from producer.dataset.normalize import normalize_row

pytestmark = pytest.mark.engine

TOOLS = Path(__file__).resolve().parents[2] / "data" / "sample" / "tools.jsonl"


def _conversations(limit: int = 16) -> list[dict]:
    out = []
    with TOOLS.open() as f:
        for n, line in enumerate(f):
            if len(out) >= limit:
                break
            sample = normalize_row(json.loads(line))
            if any(m.get("tool_calls") for m in sample["messages"]):
                out.append({**sample, "sample_id": f"t{n}"})
    return out


def _matched(sample: dict, row: dict) -> dict:
    """The same conversation with each source call's arguments the ones the model's call (in ``row``) that took its
    result was made with."""
    called = {}
    for message in row["messages"] or []:
        for call in message.get("tool_calls") or []:
            result = next((m for m in row["messages"] if m["role"] == "tool" and m.get("tool_call_id") == call["id"]),
                          None)
            if result is not None:
                called[result["content"]] = call["function"]["arguments"]
    messages = []
    for message in sample["messages"]:
        calls = message.get("tool_calls")
        if calls:
            calls = [{**c, "function": {**c["function"], "arguments": called.get(_result_of(sample, c["id"]),
                                                                                    _arguments(c))}} for c in calls]
            message = {**message, "tool_calls": calls}
        messages.append(message)
    return {**sample, "messages": messages}


def _result_of(sample: dict, call_id: str) -> str | None:
    return next((m["content"] for m in sample["messages"] if m["role"] == "tool" and m.get("tool_call_id") == call_id),
                None)


def _arguments(call: dict) -> dict:
    arguments = call["function"]["arguments"]
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def test_spliced_results_for_other_arguments_are_flagged_and_matching_ones_are_not(engine_host, renderer):
    from producer.run_config import build_run_config
    from worker.conversation.generation import generate_batch

    config = build_run_config(str(engine_host.model), max_tokens=192, seed=11, thinking="on")
    run = {"id": 1, "name": "args", "model": engine_host.model, "provenance": config.provenance(),
           "sampling": config.as_record()}
    plain = _conversations()
    first = engine_host.submit(generate_batch(engine_host, renderer, plain, run)).result(timeout=900)
    again = [_matched(s, row) for s, row in zip(plain, first, strict=True)]
    second = engine_host.submit(generate_batch(engine_host, renderer, again, run)).result(timeout=900)
    for samples, rows in ((plain, first), (again, second)):
        _check(samples, rows)
    counts = [_count(rows) for rows in (first, second)]
    assert counts[0][1] > 0, f"the first pass flagged no call: {counts}"
    assert counts[1][0] > 0, f"the second pass matched no call: {counts}"


def _count(rows: list[dict]) -> tuple[int, int]:
    """(spliced calls not flagged, flagged) of a pass."""
    flagged = sum(row["tool_args_differ"] for row in rows)
    spliced = sum(1 for row in rows for m in row["messages"] or [] if m["role"] == "tool")
    return spliced - flagged, flagged


def _check(samples: list[dict], rows: list[dict]) -> None:
    by_id = {s["sample_id"]: s for s in samples}
    for row in rows:
        source = by_id[row["sample_id"]]["messages"]
        source_calls = {c["id"]: c for m in source for c in m.get("tool_calls") or []}
        spliced = 0
        for event in row["events"]:
            message = row["messages"][event["message_index"]]
            results = {m["tool_call_id"]: m for m in row["messages"][event["message_index"] + 1:]
                       if m["role"] == "tool"}
            differ = [(d["name"], d["arguments"]) for d in event["tool_args_differ"]]
            for call in message.get("tool_calls") or []:
                result = results.get(call["id"])
                if result is None:
                    continue   # no result after it: the conversation stopped at this call
                owner = next(c for c in source_calls.values()
                             if _answers(source, c["id"], result) and c["function"]["name"] == call["function"]["name"])
                same = _arguments(owner) == call["function"]["arguments"]
                assert ((call["function"]["name"], call["function"]["arguments"]) in differ) is not same, (
                    row["sample_id"], call, owner)
                spliced += not same
        assert row["tool_args_differ"] == spliced
        if spliced:
            assert "tool_args_differ" in {f for d in classify_sample(row, Thresholds())[1] for f in d["flags"]}


def _answers(source: list[dict], call_id: str, result: dict) -> bool:
    """Whether ``result`` (spliced, relabelled) is the source's result of ``call_id``."""
    return any(m["role"] == "tool" and m.get("tool_call_id") == call_id and m["content"] == result["content"]
               for m in source)
