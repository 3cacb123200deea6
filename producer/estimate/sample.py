"""Draw the stratified random sample ``regen estimate`` runs through the engine.

The dataset is streamed once, exactly as ``regen submit`` reads it (same readers,
same normaliser, same rejects and duplicate rule), so the population the estimate
extrapolates to is the set of samples submit would register.

Strata: source file × turn-count bucket × prompt-length bucket (characters, a
cheap stand-in for tokens: no tokenizer on the producer side). Output length
depends on all three (a dataset of agent traces answers longer than a chit-chat
file; every assistant turn is one more generation; long contexts come with long
tasks), so stratifying removes their share of the sampling error.

Memory stays bounded whatever the dataset's size: every row gets a uniform random
key, and only the rows with the ``keep`` smallest keys overall (plus the
``MIN_PER_STRATUM`` smallest of each stratum) are held. Within a stratum, the rows
with the smallest keys are a simple random sample of it, so the sample drawn from
them at the end is one too. The counts of every stratum are exact.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.errors import InputRowError

from ..dataset.normalize import normalize_row
from ..dataset.readers import iter_rows

#: Upper bounds of the turn-count buckets (generations per conversation); the last is open.
TURN_BUCKETS = (1, 2, 4, 8)
#: Upper bounds (exclusive) of the prompt-length buckets, in characters; the last is open.
#: Powers of 4 from 256: a few hundred characters is a one-line question, 64K an agent trace.
CHAR_BUCKETS = (256, 1024, 4096, 16384, 65536)
#: Every non-empty stratum keeps at least this many candidates, so a rare stratum
#: (one odd file, a handful of 30-turn traces) is never missing from the sample.
MIN_PER_STRATUM = 2
#: Candidates kept overall, as a multiple of the sample size: each stratum then holds
#: about twice its proportional share, so allocation rarely runs short.
KEEP_FACTOR = 3


def generations_in(messages: list[dict[str, Any]]) -> int:
    """How many assistant turns the worker will generate: one per source assistant
    turn, plus one when the conversation ends on the user or a tool result."""
    n = sum(1 for m in messages if m.get("role") == "assistant")
    if messages and messages[-1].get("role") in ("user", "tool"):
        n += 1
    return max(n, 1)


def prompt_chars(sample: dict[str, Any]) -> int:
    """Characters of every message (content and source reasoning) and of the tool specs."""
    n = 0
    for m in sample["messages"]:
        n += len(m.get("content") or "") + len(m.get("reasoning_content") or "")
        if m.get("tool_calls"):
            n += len(json.dumps(m["tool_calls"]))
    if sample.get("tools"):
        n += len(json.dumps(sample["tools"]))
    return n


def _bucket(value: int, bounds: Sequence[int], *, inclusive: bool) -> str:
    low = 0 if not inclusive else 1
    for bound in bounds:
        if (value <= bound) if inclusive else (value < bound):
            if inclusive:
                return str(bound) if low == bound else f"{low}-{bound}"
            return f"{_short(low)}-{_short(bound)}"
        low = bound + 1 if inclusive else bound
    return f"{low}+" if inclusive else f"{_short(low)}+"


def _short(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def turn_bucket(generations: int) -> str:
    """``"1"``, ``"2"``, ``"3-4"``, ``"5-8"``, ``"9+"`` generations."""
    return _bucket(generations, TURN_BUCKETS, inclusive=True)


def chars_bucket(chars: int) -> str:
    """``"0-256"``, ``"256-1K"``, ..., ``"64K+"`` characters."""
    return _bucket(chars, CHAR_BUCKETS, inclusive=False)


def stratum_of(file: str, sample: dict[str, Any]) -> str:
    """The stratum key, readable in JSON: ``file | turns | chars``."""
    return f"{file} | turns {turn_bucket(generations_in(sample['messages']))} | chars {chars_bucket(prompt_chars(sample))}"


@dataclass
class Stratum:
    """One stratum: how many samples of the dataset fall in it, and those drawn from it."""

    key: str
    population: int = 0
    drawn: list[dict[str, Any]] = field(default_factory=list)

    @property
    def weight(self) -> float:
        """Samples of the dataset each drawn sample stands for."""
        return self.population / len(self.drawn) if self.drawn else 0.0


@dataclass
class DrawnSample:
    """The dataset's counts (as submit would report them) and the stratified sample."""

    rows_read: int = 0
    rejected: int = 0
    duplicates: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)
    strata: dict[str, Stratum] = field(default_factory=dict)

    @property
    def population(self) -> int:
        """Distinct, valid samples: what submit would register."""
        return sum(s.population for s in self.strata.values())

    @property
    def size(self) -> int:
        return sum(len(s.drawn) for s in self.strata.values())

    def conversations(self) -> list[dict[str, Any]]:
        """Every drawn conversation, each with its ``stratum`` key (in stratum order)."""
        return [{**c, "stratum": s.key} for s in self.strata.values() for c in s.drawn]

    def write_jsonl(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for c in self.conversations():
                f.write(json.dumps(c, ensure_ascii=False) + "\n")


class _Candidates:
    """The rows with the smallest random keys: ``keep`` overall, ``MIN_PER_STRATUM`` per stratum."""

    def __init__(self, keep: int):
        self.keep = keep
        self.overall: list[tuple[float, int, str, dict]] = []   # max-heap by -key
        self.per_stratum: dict[str, list[tuple[float, int, dict]]] = {}
        self.seq = 0

    def offer(self, key: float, stratum: str, sample: dict) -> None:
        self.seq += 1
        if len(self.overall) < self.keep:
            heapq.heappush(self.overall, (-key, self.seq, stratum, sample))
        elif key < -self.overall[0][0]:
            heapq.heapreplace(self.overall, (-key, self.seq, stratum, sample))
        low = self.per_stratum.setdefault(stratum, [])
        if len(low) < MIN_PER_STRATUM:
            heapq.heappush(low, (-key, self.seq, sample))
        elif key < -low[0][0]:
            heapq.heapreplace(low, (-key, self.seq, sample))

    def by_stratum(self) -> dict[str, list[dict]]:
        """Each stratum's candidates, smallest key first (the union of both heaps, deduplicated)."""
        merged: dict[str, dict[int, tuple[float, dict]]] = {}
        for neg, seq, stratum, sample in self.overall:
            merged.setdefault(stratum, {})[seq] = (-neg, sample)
        for stratum, low in self.per_stratum.items():
            for neg, seq, sample in low:
                merged.setdefault(stratum, {})[seq] = (-neg, sample)
        return {k: [s for _, s in sorted(v.values(), key=lambda t: t[0])] for k, v in merged.items()}


def allocate(populations: dict[str, int], n: int) -> dict[str, int]:
    """Proportional allocation of ``n`` draws by largest remainder, at least one per stratum.

    The minimum of one can make the total exceed ``n`` when there are more strata than draws.
    """
    total = sum(populations.values())
    if total == 0:
        return {k: 0 for k in populations}
    if n >= total:
        return dict(populations)
    exact = {k: n * p / total for k, p in populations.items()}
    out = {k: min(populations[k], max(1, int(v))) for k, v in exact.items()}
    left = n - sum(out.values())
    for k in sorted(exact, key=lambda k: (exact[k] - int(exact[k]), k), reverse=True):
        if left <= 0:
            break
        if out[k] < populations[k]:
            out[k] += 1
            left -= 1
    return out


def _id_digest(sample_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(sample_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def draw_sample(paths: Iterable[str], n: int, *, seed: int = 0) -> DrawnSample:
    """Stream ``paths`` once and draw a stratified random sample of about ``n`` conversations.

    Args:
        paths: files and folders, as ``regen submit`` takes them.
        n: sample size; every non-empty stratum gets at least one draw, so a dataset with
            more strata than ``n`` yields a few more. ``n`` ≥ the dataset's size draws it all.
        seed: the draw's random seed (the same data and seed draw the same sample).

    Returns:
        The counts and the strata, each with its population and its drawn conversations
        (normalised, with ``source``).

    Raises:
        ConfigError: from the readers (no such path, unsupported file type).
    """
    if n < 1:
        raise ValueError("sample size must be at least 1")
    rng = random.Random(seed)
    out = DrawnSample()
    candidates = _Candidates(keep=KEEP_FACTOR * n)
    # 8-byte digests, not the ids: ~70 bytes a row in a set (≈64 MB for 914K rows), not KBs.
    seen: set[int] = set()
    for raw in iter_rows(list(paths)):
        out.rows_read += 1
        if raw.error is not None:
            out.rejected += 1
            out.reject_reasons[raw.error.reason] = out.reject_reasons.get(raw.error.reason, 0) + 1
            continue
        try:
            sample = normalize_row(raw.obj)
        except InputRowError as e:
            out.rejected += 1
            out.reject_reasons[e.reason] = out.reject_reasons.get(e.reason, 0) + 1
            continue
        digest = _id_digest(sample["sample_id"])
        if digest in seen:
            out.duplicates += 1
            continue
        seen.add(digest)
        sample["source"] = {"file": raw.file, "row": raw.row}
        key = stratum_of(raw.file, sample)
        stratum = out.strata.get(key)
        if stratum is None:
            stratum = out.strata[key] = Stratum(key)
        stratum.population += 1
        candidates.offer(rng.random(), key, sample)

    allocation = allocate({k: s.population for k, s in out.strata.items()}, n)
    for key, kept in candidates.by_stratum().items():
        out.strata[key].drawn = kept[:allocation[key]]
    out.strata = dict(sorted(out.strata.items()))
    return out
