"""Rows of the two export formats, built from one output row.

``tokens``: the boundary-row layout that speculators' ``regenerate-responses`` writes
(speculators 0.9.0, ``_sample_from_response``), one row per generation event::

    {"id": "<sample_id>_gen<N>", "primary_id": "<sample_id>",
     "input_ids": prompt ids + completion ids,        (the engine's, never re-tokenised)
     "loss_mask": [0] * len(prompt) + [1] * len(completion),
     "text": decode(input_ids) with special tokens,   (for people; trainers ignore it)
     "metadata": {...}}

``speculators prepare-data --data DIR`` passes such rows through as they are, and
SpecForge's ``prepare_prompt_tasks`` reads them as pre-tokenized prompts.

``messages``: one row per sample with OpenAI-style messages, for Parquet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledger.errors import ConfigError, ShardError
from ledger.hashing import sample_seed

#: Finish reasons of a generation that completed (a cut at max_tokens is still the
#: model's own tokens). Anything else (abort, engine errors) is a failed generation and
#: never goes into a tokens export; nor does one with no completion ids.
COMPLETED_FINISHES = frozenset({"stop", "length"})

Decode = Callable[[list[list[int]]], list[str]]


def load_decoder(model: str, tokenizer_path: str | None = None) -> tuple[Decode, str]:
    """A batch decoder (special tokens kept) from the model's ``tokenizer.json``, and where it came from.

    ``tokenizer_path`` (a directory or a ``tokenizer.json``) overrides the run's model,
    whose path may exist only on the GPU nodes. A hub id is looked up in the local
    Hugging Face cache only: an export never downloads.

    Raises:
        ConfigError: no tokenizer.json can be found.
    """
    from tokenizers import Tokenizer  # the Rust tokenizer: no torch, no transformers

    candidates: list[Path] = []
    for location in (tokenizer_path, None if tokenizer_path else model):
        if not location:
            continue
        path = Path(location).expanduser()
        candidates.append(path / "tokenizer.json" if path.is_dir() else path)
    if not tokenizer_path and not Path(model).expanduser().exists():
        cached = _hub_cached_tokenizer(model)
        if cached is not None:
            candidates.append(cached)
    found = next((path for path in candidates if path.is_file() and path.name.endswith(".json")), None)
    if found is not None:
        tokenizer = Tokenizer.from_file(str(found))

        def decode(batch: list[list[int]]) -> list[str]:
            return tokenizer.decode_batch(batch, skip_special_tokens=False)

        return decode, str(found)
    tried = ", ".join(str(p) for p in candidates) or "nothing"
    raise ConfigError(f"no tokenizer.json for model {model!r} (tried {tried}); the tokens export decodes "
                      "input_ids into `text` with it: pass --tokenizer DIR")


def _hub_cached_tokenizer(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id=repo_id, filename="tokenizer.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(found) if isinstance(found, str) else None


def is_completed_generation(event: dict[str, Any]) -> bool:
    return event.get("finish_reason") in COMPLETED_FINISHES and bool(event.get("completion_token_ids"))


def token_rows(row: dict[str, Any], *, run: str, run_seed: int, sample_class: str,
               turn_classes: list[str]) -> tuple[list[dict[str, Any]], int]:
    """Boundary rows of one done sample (``text`` left empty for the caller's batch decode).

    Returns:
        The rows, and how many generations were left out as failed.
    """
    sid = row["sample_id"]
    source = row.get("source") or {}
    provenance = {**(row.get("provenance") or {}), "run": run, "model": row.get("model"),
                  "source_file": source.get("file"), "source_row": source.get("row")}
    rows = []
    left_out = 0
    for n, (event, turn_class) in enumerate(zip(row.get("events") or [], turn_classes, strict=True)):
        if not is_completed_generation(event):
            left_out += 1
            continue
        if not isinstance(event.get("turn"), int) or "prompt_token_ids" not in event:
            raise ShardError(f"sample {sid!r}: generation event {n} has no turn number or prompt ids: not a row "
                             "regen's worker writes (worker/conversation/dialogue.py)")
        prompt = list(event["prompt_token_ids"])
        completion = list(event["completion_token_ids"])
        turn = int(event["turn"])
        stop = event.get("engine_stop_reason")
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                 "total_tokens": len(prompt) + len(completion),
                 "reasoning_tokens": event.get("reasoning_tokens"), "answer_tokens": event.get("answer_tokens")}
        rows.append({
            "id": f"{sid}_gen{turn}",
            "primary_id": sid,
            "input_ids": prompt + completion,
            "loss_mask": [0] * len(prompt) + [1] * len(completion),
            "text": "",
            "metadata": {
                "turn": turn,
                "finish_reason": event["finish_reason"],
                # A token id or a stop string: kept as text so the column has one type.
                "stop_reason": "" if stop is None else str(stop),
                "is_tool_call": bool(event.get("is_tool_call")),
                "usage": usage,
                # The run's sampling with this generation's own seed (worker/conversation/generation.py).
                "sampling_params": {**(row.get("sampling") or {}), "seed": sample_seed(run_seed, sid, turn)},
                "thinking": bool(row.get("thinking")),
                "quality": sample_class,
                "turn_quality": turn_class,
                "provenance": provenance,
            },
        })
    return rows, left_out


def message_row(row: dict[str, Any], *, run: str, sample_class: str) -> dict[str, Any]:
    """One Parquet row: the regenerated conversation in OpenAI form (see MESSAGES_SCHEMA)."""
    source = row.get("source") or {}
    tools = row.get("tools")
    return {
        "sample_id": row["sample_id"],
        "messages": [_message(m) for m in row.get("messages") or []],
        "tools": json.dumps(tools, ensure_ascii=False) if tools else None,
        "quality": sample_class,
        "thinking": bool(row.get("thinking")),
        "stop_reason": row.get("stop_reason"),
        "source_file": source.get("file"),
        "source_row": source.get("row"),
        "run": run,
    }


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _message(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    return {
        "role": message.get("role"),
        "content": _text(message.get("content")),
        "reasoning_content": _text(message.get("reasoning_content")),
        "tool_calls": [_tool_call(c) for c in calls] if calls else None,
        "name": message.get("name"),
        "tool_call_id": message.get("tool_call_id"),
    }


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    return {
        "id": call.get("id"),
        "type": call.get("type") or "function",
        # A JSON string, as the OpenAI API sends it: one Parquet type whatever the tool's schema.
        # Keys keep the model's order: a chat template renders them back in that order.
        "function": {"name": function.get("name"),
                     "arguments": arguments if isinstance(arguments, str)
                     else json.dumps(arguments, ensure_ascii=False)},
    }


def messages_schema():
    """The Parquet schema of a messages export, fixed so every shard loads as one dataset."""
    import pyarrow as pa

    call = pa.struct([("id", pa.string()), ("type", pa.string()),
                      ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
    message = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string()),
                         ("tool_calls", pa.list_(call)), ("name", pa.string()), ("tool_call_id", pa.string())])
    return pa.schema([("sample_id", pa.string()), ("messages", pa.list_(message)), ("tools", pa.string()),
                      ("quality", pa.string()), ("thinking", pa.bool_()), ("stop_reason", pa.string()),
                      ("source_file", pa.string()), ("source_row", pa.int64()), ("run", pa.string())])
