"""Build a finished run directly in the ledger and the store, with output rows shaped like
``worker/conversation/generation.py:generate_sample`` writes them and token ids from a real tokenizer.

For the report and export tests: no engine, no worker, yet every byte is what a worker
would have committed (shards via ``encode_shard``, the ledger's sha256, samples' columns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from ledger.objects import ObjectStore, sha256_hex
from ledger.quality import Thresholds, classify_sample
from ledger.shards import encode_shard, input_shard_url, output_shard_url

SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0,
            "max_tokens": 64, "seed": 7, "thinking": "on", "thinking_off_share": 0.0}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


@dataclass
class Conversation:
    """A hand-made regeneration: the model's completions as text, tokenised as an engine would emit them."""

    sample_id: str
    source_file: str
    source_row: int
    #: (reasoning, answer, finish_reason, tool_call) per assistant turn; reasoning None = thinking off.
    turns: list[tuple[str | None, str, str, dict | None]] = field(default_factory=list)
    failed: bool = False


def ok(sid: str, file: str = "a.jsonl", row: int = 1, words: int = 12) -> Conversation:
    answer = " ".join(["Paris is the capital of France and its largest city"] * max(1, words // 10))
    return Conversation(sid, file, row, [("The user asks about France. Paris is its capital.", answer, "stop", None)])


def stub(sid: str, file: str = "a.jsonl", row: int = 1) -> Conversation:
    return Conversation(sid, file, row, [("", "OK.", "stop", None)])


def truncated(sid: str, file: str = "b.jsonl", row: int = 1) -> Conversation:
    return Conversation(sid, file, row, [("Let me think about the many cities of France one by one", "", "length",
                                          None)])


def tool(sid: str, file: str = "b.jsonl", row: int = 1) -> Conversation:
    return Conversation(sid, file, row, [("I should look up the weather.", "", "stop", CALL),
                                         ("The tool says 21 degrees.", "It is 21 °C and sunny in Paris today.",
                                          "stop", None)])


def aborted_last_turn(sid: str, file: str = "b.jsonl", row: int = 1) -> Conversation:
    return Conversation(sid, file, row, [("I should look up the weather.", "", "stop", CALL),
                                         ("The tool says", "", "abort", None)])


def failed(sid: str, file: str = "a.jsonl", row: int = 1) -> Conversation:
    return Conversation(sid, file, row, failed=True)


def output_row(tokenizer, conv: Conversation, *, run: str, model: str, classify: bool = True) -> dict[str, Any]:
    """The output row ``generate_sample`` would write for ``conv`` (quality stored if ``classify``)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Question {conv.sample_id}: weather in Paris?"}]
    row: dict[str, Any] = {"sample_id": conv.sample_id, "source": {"file": conv.source_file, "row": conv.source_row},
                           "input_messages": list(messages), "tools": TOOLS, "thinking": True, "model": model,
                           "sampling": {**SAMPLING, "seed": 123}, "provenance": {"engine": "vllm test",
                                                                                  "config_hash": "c" * 64}}
    if conv.failed:
        row.update(status="failed", error={"reason": "prompt_too_long", "detail": "9000 > 4096"}, messages=None,
                   events=[], finish_reason=None, stop_reason=None, turns=0, tool_calls=0,
                   usage={"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "answer_tokens": 0})
    else:
        events = []
        think_end = tokenizer.token_to_id("</think>")
        for turn, (reasoning, answer, finish, call) in enumerate(conv.turns):
            prompt_text = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n"
                                  for m in messages) + "<|im_start|>assistant\n"
            if call is not None:
                answer = "<tool_call>\n" + json.dumps(call["function"]) + "\n</tool_call>"
            if finish == "stop":
                completion_text = f"<think>\n{reasoning}\n</think>\n\n{answer}<|im_end|>"
            else:  # cut inside the thought
                completion_text = f"<think>\n{reasoning}"
            prompt = tokenizer.encode(prompt_text, add_special_tokens=False).ids
            completion = tokenizer.encode(completion_text, add_special_tokens=False).ids
            k = completion.index(think_end) if think_end in completion else len(completion)
            message: dict[str, Any] = {"role": "assistant", "reasoning_content": reasoning,
                                       "content": "" if call else (answer if finish == "stop" else "")}
            if call is not None:
                message["tool_calls"] = [{**call, "id": f"call_{turn}_0"}]
            messages.append(message)
            events.append({
                "turn": turn, "message_index": len(messages) - 1, "prompt_token_ids": prompt,
                "completion_token_ids": completion, "loss_mask": [0] * len(prompt) + [1] * len(completion),
                "finish_reason": finish, "engine_stop_reason": 2 if finish == "stop" else None,
                "is_tool_call": call is not None, "reasoning_tokens": k,
                "answer_tokens": max(0, len(completion) - k - 1),
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
                "tool_call_errors": [], "truncated_in_reasoning": finish == "length", "think_tags_ok": True,
            })
            if call is not None:
                messages.append({"role": "tool", "content": '{"temp": 21}', "tool_call_id": f"call_{turn}_0",
                                 "name": call["function"]["name"]})
            if finish != "stop":
                break
        row.update(status="done", error=None, messages=messages, events=events,
                   finish_reason=events[-1]["finish_reason"], stop_reason=None if finish == "stop" else "truncated",
                   turns=len(events), tool_calls=sum(e["is_tool_call"] for e in events),
                   usage={"prompt_tokens": sum(len(e["prompt_token_ids"]) for e in events),
                          "completion_tokens": sum(len(e["completion_token_ids"]) for e in events),
                          "reasoning_tokens": sum(e["reasoning_tokens"] for e in events),
                          "answer_tokens": sum(e["answer_tokens"] for e in events)})
    if classify:
        quality, details = classify_sample(row, Thresholds())
        row["quality"] = quality
        for event, detail in zip(row["events"], details, strict=True):
            event["quality"] = detail
    return row


def build_run(sessions, store: ObjectStore, bucket: str, tokenizer, conversations: list[Conversation], *,
              name: str, model: str, batch_size: int = 4, config_hash: str = "c" * 64, pending: int = 0,
              classify: bool = True, status: str = "finished") -> dict[str, Any]:
    """Register a run whose batches are all done (plus ``pending`` samples in a queued batch)."""
    rows = [output_row(tokenizer, c, run=name, model=model, classify=classify) for c in conversations]
    run = build_run_from_rows(sessions, store, bucket, rows, name=name, model=model, batch_size=batch_size,
                              config_hash=config_hash, status=status)
    run_id, output_url = run["id"], run["output_url"]
    if pending:
        seq = -(-len(rows) // batch_size)
        chunk = [ok(f"zz-pending-{n}", "a.jsonl", 1000 + n) for n in range(pending)]
        # A stray upload of an attempt that never committed: readers must not trust it.
        store.put(output_shard_url(output_url, seq),
                  encode_shard([output_row(tokenizer, c, run=name, model=model) for c in chunk]))
        _insert_batch(sessions, run_id, seq, chunk, status="queued", output_key=None, sha=None, rows=None,
                      output_url=output_url)
    return run


def build_run_from_rows(sessions, store: ObjectStore, bucket: str, rows: list[dict[str, Any]], *, name: str,
                        model: str, batch_size: int = 4, config_hash: str = "c" * 64, sampling: dict | None = None,
                        status: str = "finished") -> dict[str, Any]:
    """Register a finished run whose committed output rows are ``rows``, ``batch_size`` per shard."""
    output_url = f"{bucket}/{name}"
    with sessions.begin() as s:
        run_id = s.execute(text(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status, provenance) "
            "VALUES (:name, :model, CAST(:sampling AS jsonb), :hash, :url, 'regen', :bs, :status, '{}') RETURNING id"),
            {"name": name, "model": model, "sampling": json.dumps(sampling or SAMPLING), "hash": config_hash,
             "url": output_url, "bs": batch_size, "status": status}).scalar_one()
    for seq, start in enumerate(range(0, len(rows), batch_size)):
        chunk = rows[start:start + batch_size]
        data = encode_shard(chunk)
        key = output_shard_url(output_url, seq)
        store.put(key, data)
        refs = [Conversation(r["sample_id"], r["source"]["file"], r["source"]["row"]) for r in chunk]
        _insert_batch(sessions, run_id, seq, refs, status="done", output_key=key, sha=sha256_hex(data), rows=chunk,
                      output_url=output_url)
    return {"id": run_id, "name": name, "output_url": output_url}


def _insert_batch(sessions, run_id, seq, chunk, *, status, output_key, sha, rows, output_url) -> None:
    with sessions.begin() as s:
        batch_id = s.execute(text(
            "INSERT INTO batches (run_id, seq, status, attempts, input_key, output_key, output_sha256, n_samples) "
            "VALUES (:run, :seq, :status, 1, :ik, :ok, :sha, :n) RETURNING id"),
            {"run": run_id, "seq": seq, "status": status, "ik": input_shard_url(output_url, seq), "ok": output_key,
             "sha": sha, "n": len(chunk)}).scalar_one()
        for n, conv in enumerate(chunk):
            row = rows[n] if rows else None
            usage = row["usage"] if row else {}
            s.execute(text(
                "INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status, finish_reason, "
                "turns, prompt_tokens, completion_tokens, reasoning_tokens, answer_tokens, tool_calls, output_key, "
                "error, quality) VALUES (:run, :sid, :batch, :file, :row, :status, :finish, :turns, :pt, :ct, :rt, "
                ":at, :tc, :key, :error, :quality)"),
                {"run": run_id, "sid": conv.sample_id, "batch": batch_id, "file": conv.source_file,
                 "row": conv.source_row, "status": row["status"] if row else "pending",
                 "finish": row and row["finish_reason"], "turns": row and row["turns"],
                 "pt": usage.get("prompt_tokens"), "ct": usage.get("completion_tokens"),
                 "rt": usage.get("reasoning_tokens"), "at": usage.get("answer_tokens"),
                 "tc": row and row["tool_calls"], "key": output_key,
                 "error": row and row["error"] and f"{row['error']['reason']}: {row['error']['detail']}",
                 "quality": row.get("quality") if row else None})
