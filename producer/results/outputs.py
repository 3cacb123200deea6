"""Reading a run's results the way the ledger vouches for them (shared by report and export).

Only committed results count: a sample whose status is done or failed, in a batch
the ledger marks done, read from the output shard its ``output_key`` names, whose
bytes must match the SHA-256 the commit recorded. An object in the bucket that no
commit points at (an attempt that uploaded and then lost its lease) is never read.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger.errors import ChecksumMismatch
from ledger.objects import ObjectStore
from ledger.quality import Thresholds, classify_sample
from ledger.shards import decode_shard

#: Why a fake engine's rows are never results (worker/engine/fake.py): export, report and status say it.
FAKE_ROWS_WHY = ("made by the fake engine (a benchmark device: random token ids, not generated data); never "
                 "exported")


def is_fake_row(row: dict[str, Any]) -> bool:
    """An output row a fake engine made (its ``fake_engine`` field), whatever the ledger recorded."""
    return bool(row.get("fake_engine"))

#: Output shards fetched at once: S3 latency hides behind a few parallel GETs, and each
#: shard in flight holds its bytes (tens of MB for long completions) in memory.
FETCH_THREADS = 4
FETCH_AHEAD = 8


#: One committed sample, as the ledger describes it (the columns every reader needs).
COMMITTED_COLUMNS = ("sample_id", "status", "quality", "output_key", "output_sha256", "turns", "source_file",
                     "source_row", "completion_tokens", "reasoning_tokens", "answer_tokens", "tool_calls",
                     "finish_reason", "fake")

_COMMITTED = text("""
SELECT s.sample_id, s.status, s.quality, s.output_key, b.output_sha256, s.turns, s.source_file, s.source_row,
       s.completion_tokens, s.reasoning_tokens, s.answer_tokens, s.tool_calls, s.finish_reason, b.fake
FROM samples s JOIN batches b ON b.id = s.batch_id
WHERE s.run_id = :run AND s.status IN ('done', 'failed') AND b.status = 'done' AND b.output_key = s.output_key
""")


def committed_samples(session: Session, run_id: int) -> Iterator[Any]:
    """Every committed sample of a run (rows with ``COMMITTED_COLUMNS``), streamed from the server."""
    result = session.execute(_COMMITTED.execution_options(stream_results=True, yield_per=10_000), {"run": run_id})
    yield from result


def sample_status_counts(session: Session, run_id: int) -> dict[str, int]:
    """All samples of a run by status (committed or not)."""
    rows = session.execute(text("SELECT status, count(*) FROM samples WHERE run_id = :run GROUP BY status"),
                           {"run": run_id})
    return {status: int(n) for status, n in rows}


def read_shards(store: ObjectStore, shards: Iterable[tuple[str, str | None]], *, threads: int = FETCH_THREADS,
                ahead: int = FETCH_AHEAD) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Fetch ``(url, expected sha256)`` shards a few at a time; yield ``(url, rows)`` in the given order.

    Raises:
        ChecksumMismatch: a shard's bytes are not the ones its commit recorded.
        StoreError, ShardError: as ``ObjectStore.get`` and ``decode_shard``.
    """
    todo = iter(shards)
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shard-get") as pool:
        pending: deque = deque()

        def submit_next() -> None:
            nxt = next(todo, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(store.get, nxt[0])))

        for _ in range(max(1, ahead)):
            submit_next()
        while pending:
            (url, expected), future = pending.popleft()
            data = future.result()
            submit_next()
            actual = hashlib.sha256(data).hexdigest()
            if expected is not None and actual != expected:
                raise ChecksumMismatch(f"{url}: the ledger recorded sha256={expected}, the store holds {actual}")
            yield url, list(decode_shard(data))


def row_quality(row: dict[str, Any], thresholds: Thresholds) -> tuple[str, list[dict[str, Any]]]:
    """The class and per-turn detail the worker stored in the row, else classified now.

    Rows written before classification existed carry neither; classifying them here
    with the run's thresholds gives what the worker would have written.
    """
    events = row.get("events") or []
    if "quality" in row and all(isinstance(e.get("quality"), dict) for e in events):
        return row["quality"], [e["quality"] for e in events]
    return classify_sample(row, thresholds)
