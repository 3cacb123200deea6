"""Completion tokens under the loss mask, counted by token id while the export reads its rows.

What is counted: the completion ids of every completed generation of an exported
training-side sample, the tokens a tokens export marks ``loss_mask`` 1 (a messages
export counts the same generations). Eval-side samples are never counted: the draft
vocabulary must come from training data only.

Memory stays flat however many export shards there are: each output shard's counts per
export shard are appended to a small spill file of ``(token_id, count)`` int64 pairs, and
reduced when that export shard is written.

File: Parquet, columns ``token_id`` (int64) and ``count`` (int64), one row per token id
seen, sorted by ``token_id``; ``pyarrow.parquet.read_table(path).to_pydict()`` reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .export_rows import is_completed_generation

STATS_DIR = "stats"
TOTAL_FILE = "token_counts.parquet"
SUFFIX = ".token_counts.parquet"


def completion_ids(row: dict[str, Any]) -> list[int]:
    """The ids under the loss mask of one sample: every completed generation's completion."""
    ids: list[int] = []
    for event in row.get("events") or []:
        if is_completed_generation(event):
            ids.extend(event["completion_token_ids"])
    return ids


def append_counts(path: Path, ids: list[int]) -> None:
    """Append the counts of ``ids`` to a spill file of int64 ``(token_id, count)`` pairs."""
    if not ids:
        return
    unique, counts = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
    with open(path, "ab") as f:
        np.stack([unique, counts.astype(np.int64)], axis=1).tofile(f)


def reduce_counts(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The spill file's pairs summed per token id: ``(token_ids ascending, counts)``."""
    if not path.exists():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    pairs = np.fromfile(path, dtype=np.int64).reshape(-1, 2)
    unique, inverse = np.unique(pairs[:, 0], return_inverse=True)
    counts = np.zeros(len(unique), dtype=np.int64)
    np.add.at(counts, inverse, pairs[:, 1])
    return unique, counts


class Totals:
    """The export's counts over every training file, dense by token id (a vocabulary is small)."""

    def __init__(self) -> None:
        self.dense = np.zeros(0, dtype=np.int64)

    def add(self, ids: np.ndarray, counts: np.ndarray) -> None:
        if not len(ids):
            return
        if ids[-1] >= len(self.dense):
            self.dense = np.concatenate([self.dense, np.zeros(int(ids[-1]) + 1 - len(self.dense), dtype=np.int64)])
        self.dense[ids] += counts

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        ids = np.flatnonzero(self.dense).astype(np.int64)
        return ids, self.dense[ids]


def write_counts(path: Path, ids: np.ndarray, counts: np.ndarray) -> dict[str, Any]:
    """Write one statistics file; return its manifest entry (path relative to the export root)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"token_id": pa.array(ids, pa.int64()), "count": pa.array(counts, pa.int64())})
    pq.write_table(table, path, compression="zstd")
    return {"path": f"{path.parent.name}/{path.name}", "tokens": int(counts.sum()), "distinct": len(ids)}
