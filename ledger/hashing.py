"""Stable hashes: the run's config hash and per-sample seeds."""

from __future__ import annotations

import hashlib
import json


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(config: dict) -> str:
    """sha256 of everything that changes what the model generates for a run."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def derived_int(*parts: object, bits: int = 31) -> int:
    """A deterministic non-negative integer from the given parts (seeds, mix choices)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << bits) - 1)


def sample_seed(run_seed: int, sample_id: str, turn: int) -> int:
    """The seed of one generation event: reproducible from the run seed, the sample and the turn."""
    return derived_int("seed", run_seed, sample_id, turn)


def thinking_enabled(mode: str, off_share: float, sample_id: str) -> bool:
    """Whether this sample is generated in thinking mode (``mode`` on | off | mix)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return derived_int("thinking", sample_id, bits=32) / 2**32 >= off_share


def history_kept(mode: str, share: float, sample_id: str) -> bool:
    """Whether this conversation renders earlier turns' thoughts (``--preserve-thinking`` on | off | mix: ``share``
    of the conversations, drawn apart from the thinking mode's draw)."""
    if mode in ("on", "off"):
        return mode == "on"
    return derived_int("preserve_thinking", sample_id, bits=32) / 2**32 < share
