"""The export's fixed train/eval split: a sample's side is a pure function of its id and a seed.

A sample is held out when ``derived_int("split", seed, sample_id, bits=64) / 2**64 <
eval_share``: the first 8 bytes (big-endian) of ``sha256("split\\x1f<seed>\\x1f<sample_id>")``
as a fraction of 2**64. Nothing else enters the hash, so the split is the same on a rerun,
with other ``--include`` classes and with other runs merged in: a sample id stays on its side.
Every generation (tokens row) of a conversation carries its sample id, so they share a side.
"""

from __future__ import annotations

from ledger.errors import ConfigError
from ledger.hashing import derived_int

TRAIN = "train"
EVAL = "eval"
RULE = ("eval when int.from_bytes(sha256(f'split\\x1f{seed}\\x1f{sample_id}')[:8], 'big') / 2**64 < eval_share "
        "(ledger.hashing.derived_int('split', seed, sample_id, bits=64)); every row of a sample shares its side")


def check_eval_share(eval_share: float) -> None:
    if not 0.0 <= eval_share < 1.0:
        raise ConfigError(f"--eval-share must be at least 0 and below 1 (a share of the samples), not {eval_share}")


def side_of(sample_id: str, seed: int, eval_share: float) -> str:
    """``eval`` or ``train`` for one sample (always ``train`` when ``eval_share`` is 0)."""
    if eval_share <= 0.0:
        return TRAIN
    return EVAL if derived_int("split", seed, sample_id, bits=64) / 2**64 < eval_share else TRAIN
