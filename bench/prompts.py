"""Synthetic workloads for the benchmarks: deterministic for a seed, written as JSONL, streamed.

Two shapes:

* **Throughput prompts** (``throughput_rows``): one user turn each, plus a per-row
  ``max_tokens`` drawn from a lognormal capped at a maximum. Random-weight models
  do not stop on their own, so the budget *is* the output length: a long tail like
  thinking traces, scaled down for a CPU (mean ~200, cap 1,400 tokens; production
  is mean ~1,500, cap 32K).
* **Scale conversations** (``scale_lines``): 1-2 KB OpenAI-form rows mixing system
  prompts, multi-turn chats and tool calls, with a few malformed rows and repeated
  ids so the producer's rejected and duplicate paths run as they would on real data.

Text is drawn from a pool of sentences over the tiny model's lexicon, so prompts
tokenize into few tokens with its BPE and generating a million rows takes seconds.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from worker.tiny.model import IDENTIFIERS, WORDS

#: Sentences in the pool rows are drawn from: enough that rows differ, small enough to build at once.
SENTENCE_POOL = 4096
#: Bump when the generated rows change, so cached datasets are rebuilt.
DATASET_VERSION = 2
MARKER_FILE = "regen_bench_dataset.json"

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sentence_pool(seed: int, size: int = SENTENCE_POOL) -> list[str]:
    rng = random.Random(f"sentences-{seed}")
    return [" ".join(rng.choices(WORDS, k=rng.randint(5, 14))).capitalize() + rng.choice("....?!")
            for _ in range(size)]


def lognormal_lengths(n: int, *, mean: float, cap: int, sigma: float = 1.0, seed: int = 0) -> list[int]:
    """``n`` lengths from a lognormal with the given (uncapped) mean, clipped to ``[1, cap]``.

    ``sigma`` 1.0 puts ~1% of the mass above 7x the mean: the few runaway-long
    generations that hold a static batch open.
    """
    if mean <= 0 or cap < 1:
        raise ValueError("mean must be positive and cap at least 1")
    rng = random.Random(f"lengths-{seed}")
    mu = math.log(mean) - sigma * sigma / 2
    return [max(1, min(cap, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def throughput_rows(n: int, *, seed: int = 0, mean_tokens: float = 200.0, max_tokens: int = 1400,
                    sigma: float = 1.0) -> list[dict]:
    """``n`` single-turn prompts (10-120 words), each with its own output budget ``max_tokens``."""
    rng = random.Random(f"prompts-{seed}")
    pool = sentence_pool(seed)
    lengths = lognormal_lengths(n, mean=mean_tokens, cap=max_tokens, sigma=sigma, seed=seed)
    rows = []
    for i, budget in enumerate(lengths):
        words = rng.randint(10, 120)
        text = []
        while sum(len(s.split()) for s in text) < words:
            text.append(rng.choice(pool))
        rows.append({"id": f"tp-{seed}-{i:06d}", "messages": [{"role": "user", "content": " ".join(text)}],
                     "max_tokens": budget})
    return rows


# --------------------------------------------------------------------------- scale conversations

def _text(rng: random.Random, pool: list[str], sentences: int) -> str:
    return " ".join(rng.choices(pool, k=sentences))


def _tool_conversation(rng: random.Random, pool: list[str]) -> dict:
    name = rng.choice(IDENTIFIERS[:16])
    arg = rng.choice(IDENTIFIERS[16:])
    call_id = f"call_{rng.randrange(1 << 30):x}"
    tools = [{"type": "function", "function": {
        "name": name, "description": _text(rng, pool, 1),
        "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}]
    return {"tools": tools, "messages": [
        {"role": "user", "content": _text(rng, pool, rng.randint(2, 5))},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": json.dumps({arg: rng.choice(WORDS)})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": _text(rng, pool, rng.randint(3, 8))},
        {"role": "assistant", "content": _text(rng, pool, rng.randint(5, 10))},
    ]}


def _conversation(rng: random.Random, pool: list[str]) -> dict:
    kind = rng.random()
    if kind < 0.10:
        return _tool_conversation(rng, pool)
    if kind < 0.30:
        turns = []
        for _ in range(2):
            turns += [{"role": "user", "content": _text(rng, pool, rng.randint(2, 4))},
                      {"role": "assistant", "content": _text(rng, pool, rng.randint(5, 9))}]
        return {"messages": turns}
    messages = [{"role": "user", "content": _text(rng, pool, rng.randint(3, 8))},
                {"role": "assistant", "content": _text(rng, pool, rng.randint(12, 24))}]
    if kind < 0.50:
        messages.insert(0, {"role": "system", "content": _text(rng, pool, rng.randint(2, 4))})
    return {"messages": messages}


#: Malformed rows, in turn: each is rejected by the reader or the normaliser with its own reason.
_BAD_ROWS = (
    '{"id": "bad", "messages": [{"role": "user", "content": "cut off',          # malformed_json
    '{"messages": [{"role": "assistant", "content": "no question"}]}',          # no_user_turn
    '{"messages": [{"role": "narrator", "content": "who speaks?"}]}',           # unknown_role
)


def scale_lines(n: int, *, seed: int = 0, bad_every: int = 1000, duplicate_every: int = 2000) -> Iterator[str]:
    """``n`` JSONL lines (without newlines) of 1-2 KB conversations.

    One line in ``bad_every`` is malformed and one row in ``duplicate_every`` reuses
    the previous row's id with other content (a ``duplicate_id`` rejection).
    """
    rng = random.Random(f"scale-{seed}")
    pool = sentence_pool(seed)
    for i in range(n):
        if bad_every and i % bad_every == bad_every - 1:
            yield _BAD_ROWS[(i // bad_every) % len(_BAD_ROWS)]
            continue
        row = _conversation(rng, pool)
        # Offset from the bad lines, so the row whose id is reused is a good one.
        is_duplicate = duplicate_every and i % duplicate_every == duplicate_every // 2 + 1
        row["id"] = f"scale-{seed}-{i - 1 if is_duplicate else i:07d}"
        yield _dumps(row)


def write_jsonl(path: Path, lines: Iterable[str]) -> int:
    """Write lines (JSON text, or dicts to encode) to ``path``; return the bytes written."""
    size = 0
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as f:
        for line in lines:
            text = (line if isinstance(line, str) else _dumps(line)) + "\n"
            size += f.write(text)
    return size


def write_scale_dataset(out_dir: Path, rows: int, *, seed: int = 0, files: int = 8) -> list[Path]:
    """The scale dataset as ``files`` JSONL files under ``out_dir``, reused when already there.

    Rows are streamed to disk as generated: memory stays flat whatever ``rows`` is.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"part-{k:03d}.jsonl" for k in range(files)]
    marker = out_dir / MARKER_FILE
    spec = {"rows": rows, "seed": seed, "files": files, "version": DATASET_VERSION}
    if marker.is_file() and json.loads(marker.read_text()) == spec and all(p.is_file() for p in paths):
        return paths
    marker.unlink(missing_ok=True)
    lines = scale_lines(rows, seed=seed)
    per_file = math.ceil(rows / files)
    for k, path in enumerate(paths):
        write_jsonl(path, itertools.islice(lines, max(0, min(per_file, rows - k * per_file))))
    marker.write_text(json.dumps(spec))
    return paths
