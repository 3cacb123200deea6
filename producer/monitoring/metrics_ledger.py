"""The ledger's part of a ``regen metrics`` scrape: every figure from a counter or a bounded slice.

A scrape's reads grow with the runs and with the batches that are open (queued, running),
failed or fake, never with the done history (issue 58, item 7). Per statement, what it reads:

* runs, and per run the trigger-kept counters: ``run_batch_counts`` (open, done, dead batches,
  tokens; 65 rows per run, migration 0011), ``run_sample_counts`` (samples by status and
  class; 64 shards per status and class) and ``run_rejected_counts`` (rows by reason,
  migration 0015);
* the queued batches (refused ones among them) and the running ones (per worker, the oldest
  heartbeat), by ``(run_id, status)``; planned is what the open counter leaves;
* the last commit: the last entry of migration 0009's ``(run_id, finished_at)`` index of
  done batches, one index probe per run;
* failed attempts: migration 0015's partial index of the batches with ``failures > 0``;
* fake batches and refusals: migration 0010's partial index of those batches.

bench/metrics_scale.py measures it against the full scans it replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ledger.states import REFUSED_PREFIX, BatchStatus, Quality, SampleStatus

_RUNS = text("SELECT id, name, model, queue, status FROM runs ORDER BY id")
#: Sums over the shards come back as numerics; cast to bigint, they come back as ints.
_COUNTERS = text(
    "SELECT run_id, sum(open_batches)::bigint AS open, sum(done_batches)::bigint AS done, "
    "sum(dead_batches)::bigint AS dead, sum(done_prompt_tokens)::bigint AS prompt, "
    "sum(done_completion_tokens)::bigint AS completion FROM run_batch_counts GROUP BY run_id")
_SAMPLES = text("SELECT run_id, status, quality, sum(n)::bigint FROM run_sample_counts GROUP BY 1, 2, 3")
_REJECTED = text("SELECT run_id, reason, n FROM run_rejected_counts WHERE n <> 0 ORDER BY 1, 2")
_QUEUED = text(
    "SELECT run_id, count(*), count(*) FILTER (WHERE starts_with(error, :refused)) FROM batches "
    "WHERE run_id = ANY(CAST(:runs AS int[])) AND status = 'queued' GROUP BY run_id")
# The oldest lease among a worker's batches, aged by the ledger's own clock.
_RUNNING = text(
    "SELECT run_id, worker, count(*), extract(epoch FROM now() - min(heartbeat_at)) FROM batches "
    "WHERE run_id = ANY(CAST(:runs AS int[])) AND status = 'running' GROUP BY run_id, worker")
#: A correlated max() per run: the planner reads it from the end of the run's part of the index.
_LAST_COMMIT = text(
    "SELECT r.id, extract(epoch FROM (SELECT max(b.finished_at) FROM batches b "
    "WHERE b.run_id = r.id AND b.status = 'done')) FROM runs r")
_FAILURES = text("SELECT run_id, sum(failures)::bigint FROM batches WHERE failures > 0 GROUP BY run_id")
_FAKE = text(
    "SELECT run_id, count(*) FILTER (WHERE fake AND status = 'done'), sum(fake_refusals)::bigint FROM batches "
    "WHERE fake OR fake_refusals > 0 GROUP BY run_id")


@dataclass(frozen=True)
class SampleCounts:
    by_status: dict[str, int]
    by_quality: dict[str, int]


@dataclass
class RunFigures:
    """One run's figures of a scrape."""

    #: Every batch status, zeros included.
    batches: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in BatchStatus})
    #: Planned, queued and running, from the run's counters: planned is what queued and running leave.
    open_batches: int = 0
    samples: SampleCounts = field(default_factory=lambda: SampleCounts({s.value: 0 for s in SampleStatus}, {}))
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Failed attempts over the run's batches (``regen retry --dead`` resets those of dead ones).
    failures: int = 0
    #: The last commit (Unix time); None before the first.
    last_commit_s: float | None = None
    #: Done batches a fake engine made, and deliveries fake engines refused.
    fake_batches: int = 0
    fake_refusals: int = 0
    #: Queued batches whose last attempt a worker refused.
    refused: int = 0


@dataclass
class LedgerFigures:
    runs: list[dict] = field(default_factory=list)
    per_run: dict[int, RunFigures] = field(default_factory=dict)
    #: (run_id, reason, rows)
    rejected: list[tuple[int, str, int]] = field(default_factory=list)
    #: (run_id, worker, running batches, oldest heartbeat age s)
    running: list[tuple[int, str, int, float]] = field(default_factory=list)


def read_ledger(db: Engine) -> LedgerFigures:
    """Every ledger figure of one scrape, read in one snapshot (REPEATABLE READ).

    One snapshot: the batch and sample figures describe the same moment, and the counters,
    which triggers keep in the writers' transactions, agree with the rows read beside them.
    """
    figures = LedgerFigures()
    with db.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        figures.runs = [dict(r) for r in conn.execute(_RUNS).mappings()]
        figures.per_run = {r["id"]: RunFigures() for r in figures.runs}
        run_ids = list(figures.per_run)
        _read_counters(conn, figures.per_run)
        _read_samples(conn, figures.per_run)
        figures.rejected = [(r[0], r[1], int(r[2])) for r in conn.execute(_REJECTED)]
        for run_id, queued, refused in conn.execute(_QUEUED, {"runs": run_ids, "refused": REFUSED_PREFIX}):
            run = figures.per_run[run_id]
            run.batches[BatchStatus.QUEUED.value], run.refused = int(queued), int(refused)
        figures.running = [(r[0], r[1] or "?", int(r[2]), float(r[3] or 0.0))
                           for r in conn.execute(_RUNNING, {"runs": run_ids})]
        for run_id, _, n, _ in figures.running:
            figures.per_run[run_id].batches[BatchStatus.RUNNING.value] += n
        for run_id, last in conn.execute(_LAST_COMMIT):
            if run_id in figures.per_run:
                figures.per_run[run_id].last_commit_s = None if last is None else float(last)
        for run_id, failures in conn.execute(_FAILURES):
            if run_id in figures.per_run:
                figures.per_run[run_id].failures = int(failures)
        for run_id, fake, refusals in conn.execute(_FAKE):
            if run_id in figures.per_run:
                figures.per_run[run_id].fake_batches, figures.per_run[run_id].fake_refusals = int(fake), int(refusals)
    for run in figures.per_run.values():
        b = run.batches
        b[BatchStatus.PLANNED.value] = max(0, run.open_batches - b[BatchStatus.QUEUED.value]
                                           - b[BatchStatus.RUNNING.value])
    return figures


def _read_counters(conn: Connection, per_run: dict[int, RunFigures]) -> None:
    for r in conn.execute(_COUNTERS).mappings():
        run = per_run.get(r["run_id"])
        if run is None:
            continue
        run.open_batches = int(r["open"])
        run.batches[BatchStatus.DONE.value] = int(r["done"])
        run.batches[BatchStatus.DEAD.value] = int(r["dead"])
        run.prompt_tokens, run.completion_tokens = int(r["prompt"]), int(r["completion"])


def _read_samples(conn: Connection, per_run: dict[int, RunFigures]) -> None:
    """Samples by status and by quality class (worst class first, ledger/quality.py's order), as status.py's."""
    by_status: dict[int, dict[str, int]] = {rid: {s.value: 0 for s in SampleStatus} for rid in per_run}
    by_quality: dict[int, dict[str, int]] = {rid: {} for rid in per_run}
    for run_id, status, quality, n in conn.execute(_SAMPLES):
        if run_id not in per_run:
            continue
        by_status[run_id][status] = by_status[run_id].get(status, 0) + int(n)
        if quality:
            by_quality[run_id][quality] = by_quality[run_id].get(quality, 0) + int(n)
    for run_id, run in per_run.items():
        quality = by_quality[run_id]
        run.samples = SampleCounts(by_status[run_id], {q.value: quality[q.value] for q in Quality
                                                       if quality.get(q.value)})
