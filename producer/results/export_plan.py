"""Which committed sample goes into which export shard: planned in one streamed pass, kept on disk.

An export writes its rows sorted by sample id and cut into shards of a fixed number of rows, so
the shard a sample lands in depends on its rank among the kept samples of its side (train or
eval), known only in sample-id order. Output shards, though, are read one batch at a time, and a
batch's samples are scattered over that order (sample ids are content hashes). Holding the whole
placement in a dict bridged the two orders at the cost of ~300 bytes a sample: 3 GB at 10M samples.
The plan bridges them on disk instead:

1. Postgres streams the committed samples sorted by sample id (its sort spills to its own disk).
   ``COLLATE "C"``: code-point order, which is Python's ``str`` order, whatever the database's
   collation, so the shards' ranges agree with the sort of each shard's rows later;
2. each kept sample's place (side, shard, run, class) is appended to one of ``n_buckets`` files,
   chosen by its batch, and each done batch's output key and SHA-256 to its batch's file;
3. the export loads one bucket at a time, ``{output key: (sha256, {sample id: place})}`` for
   about ``BUCKET_SAMPLES`` samples, and reads that bucket's output shards.

Memory: one bucket and ``FLUSH_LINES`` buffered lines, whatever the run's size; disk: ~60 bytes
a sample. The selection rules (first-named run wins a sample id, failed, fake, left-out classes)
are the ones ``regen export`` documents (producer/results/export.py).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session
from sqlalchemy.types import Integer

from ledger.quality import Quality

from .export_split import EVAL, TRAIN, side_of

#: Samples per bucket loaded at once: ~150 bytes each in memory (a dict entry and its place).
BUCKET_SAMPLES = 100_000
#: Lines buffered before they are appended to their bucket files (opened and closed per flush, so
#: a 1,000-bucket plan holds no file descriptors open).
FLUSH_LINES = 50_000
#: The left-out reason of a fake engine's rows (export.py reads it from here).
FAKE = "fake_engine"
#: Postgres's sort of the samples: more memory before it spills to temporary files.
SORT_WORK_MEM = "128MB"

# The committed samples of the named runs in sample-id order, then in the order the runs were named.
# Only the columns the plan needs: they are what Postgres sorts.
_IN_ORDER = text("""
SELECT s.sample_id, array_position(:runs, s.run_id) AS run_order, s.batch_id, s.status, s.quality, s.turns,
       b.fake
FROM samples s JOIN batches b ON b.id = s.batch_id
WHERE s.run_id = ANY(:runs) AND s.status IN ('done', 'failed') AND b.status = 'done' AND b.output_key = s.output_key
ORDER BY s.sample_id COLLATE "C", run_order
""").bindparams(bindparam("runs", type_=ARRAY(Integer)))

_DONE_BATCHES = text("""
SELECT id, output_key, output_sha256 FROM batches WHERE run_id = ANY(:runs) AND status = 'done'
""").bindparams(bindparam("runs", type_=ARRAY(Integer)))


@dataclass(frozen=True)
class Place:
    """Where one kept sample goes."""

    side: str
    shard: int
    #: The index of its run in the runs named to the export.
    run: int
    #: The ledger's class; None for samples committed before classification existed.
    quality: str | None


@dataclass(frozen=True)
class OutputShard:
    """One output shard to read, and what the export takes from it."""

    url: str
    sha256: str | None
    wanted: dict[str, Place]


class _BatchSet:
    """Batch ids seen, as a bitmap: the distinct output shards a plan reads, counted in a few MB
    (a bit per batch id of the ledger) where a set would grow with the run."""

    def __init__(self) -> None:
        self._bits = bytearray()
        self.count = 0

    def add(self, batch_id: int) -> None:
        byte, bit = divmod(batch_id, 8)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        if not self._bits[byte] >> bit & 1:
            self._bits[byte] |= 1 << bit
            self.count += 1


class _Buckets:
    """Lines appended to ``n`` bucket files, buffered."""

    def __init__(self, folder: Path, n: int) -> None:
        self.folder = folder
        self.n = n
        self._pending: list[list[str]] = [[] for _ in range(n)]
        self._buffered = 0

    def path(self, bucket: int) -> Path:
        return self.folder / f"plan-{bucket:05d}.jsonl"

    def add(self, batch_id: int, record: list) -> None:
        self._pending[batch_id % self.n].append(json.dumps(record, ensure_ascii=False) + "\n")
        self._buffered += 1
        if self._buffered >= FLUSH_LINES:
            self.flush()

    def flush(self) -> None:
        for bucket, lines in enumerate(self._pending):
            if lines:
                with open(self.path(bucket), "a", encoding="utf-8") as f:
                    f.writelines(lines)
                lines.clear()
        self._buffered = 0


class ExportPlan:
    """The placement of a run's committed samples in export shards, written under ``folder``.

    Build it with :meth:`build`; then :meth:`output_shards` yields the output shards to read,
    one bucket in memory at a time.
    """

    def __init__(self, folder: Path, n_buckets: int) -> None:
        self._buckets = _Buckets(folder, n_buckets)
        #: Export shards per side (0 for a side with no sample).
        self.n_shards: dict[str, int] = {TRAIN: 0, EVAL: 0}
        #: Committed samples per run index (whether kept or not).
        self.committed: Counter = Counter()
        #: Output shards the plan reads (those holding at least one kept sample).
        self.n_output_shards = 0

    @classmethod
    def build(cls, session: Session, run_ids: list[int], folder: Path, *, expected_samples: int, fmt: str,
              kept: set[str], rows_per_shard: int, seed: int, eval_share: float, left_out: Counter
              ) -> ExportPlan:
        """Stream the runs' committed samples in sample-id order and place each kept one.

        Args:
            expected_samples: the runs' samples (an upper bound of the committed): sizes the buckets.
            fmt: ``tokens`` weighs a sample by its turns (one row each), ``messages`` by 1.
            left_out: counts every committed sample not placed, by reason.

        Samples are taken in sample-id order (then run order: a sample id in two runs is placed
        from the first named); each side's shard closes before the sample that would take it past
        ``rows_per_shard`` (a tokens shard counts the sample's turns, an upper bound).
        """
        plan = cls(folder, max(1, -(-expected_samples // BUCKET_SAMPLES)))
        buckets = plan._buckets
        session.execute(text(f"SET LOCAL work_mem = '{SORT_WORK_MEM}'"))
        for batch_id, url, sha in session.execute(_DONE_BATCHES.execution_options(stream_results=True,
                                                                                   yield_per=10_000),
                                                  {"runs": run_ids}):
            buckets.add(batch_id, [batch_id, url, sha])
        filling = {TRAIN: [0, 0], EVAL: [0, 0]}  # side: [shard, rows in it]
        used: set[str] = set()
        read = _BatchSet()
        previous = None
        rows = session.execute(_IN_ORDER.execution_options(stream_results=True, yield_per=10_000),
                               {"runs": run_ids})
        for sample_id, run_order, batch_id, status, quality, turns, fake in rows:
            run = run_order - 1
            plan.committed[run] += 1
            if sample_id == previous:
                left_out["duplicate_sample_id"] += 1
                continue
            previous = sample_id
            if status != "done":
                left_out[Quality.FAILED.value] += 1
                continue
            if fake:
                left_out[FAKE] += 1  # a fake engine's batch (migration 0010): never training data
                continue
            if quality is not None and quality not in kept:
                left_out[quality] += 1
                continue
            side = side_of(sample_id, seed, eval_share)
            at = filling[side]
            weight = max(1, turns or 1) if fmt == "tokens" else 1
            if at[1] and at[1] + weight > rows_per_shard:
                at[0], at[1] = at[0] + 1, 0
            at[1] += weight
            used.add(side)
            read.add(batch_id)
            buckets.add(batch_id, [batch_id, sample_id, side, at[0], run, quality])
        buckets.flush()
        plan.n_shards = {side: (filling[side][0] + 1 if side in used else 0) for side in (TRAIN, EVAL)}
        plan.n_output_shards = read.count
        return plan

    def output_shards(self) -> Iterator[list[OutputShard]]:
        """The output shards to read, a bucket's worth at a time (by URL within a bucket)."""
        for bucket in range(self._buckets.n):
            path = self._buckets.path(bucket)
            if not path.exists():
                continue
            where: dict[int, tuple[str, str | None]] = {}
            wanted: dict[int, dict[str, Place]] = {}
            with open(path, encoding="utf-8") as f:
                for line in f:
                    record = json.loads(line)
                    if len(record) == 3:
                        where[record[0]] = (record[1], record[2])
                    else:
                        batch_id, sample_id, side, shard, run, quality = record
                        wanted.setdefault(batch_id, {})[sample_id] = Place(side, shard, run, quality)
            yield sorted((OutputShard(*where[batch_id], places) for batch_id, places in wanted.items()),
                         key=lambda shard: shard.url)
