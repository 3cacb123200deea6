"""``regen submit``: register a dataset as a run, write input shards, enqueue batches (up to the window).

The producer streams the input (a 914K-row dataset is never held in memory), and
works in *groups* of batches so there is no round trip per row or per batch: one dedupe
query, one input object (the group's shards packed, ledger/shards.py), one transaction
(COPY) and one pipelined publish per group.
Groups are written in two stages, each one thread working in order: one encodes and
uploads a group's input object while the other commits and publishes the group before
it, and the calling thread reads and normalises the next group (bench/submit_scale.py
measures the phases).

Order of effects, so that a crash anywhere is finished by running the same submit
again (and nothing is enqueued twice):

1. upload the group's input object (unreferenced objects may be overwritten later);
2. one transaction: batches (status ``planned``) + samples + rejected rows;
3. while the run's queue holds fewer than the window's messages (``REGEN_QUEUE_WINDOW``,
   10,000), mark the run's planned batches ``queued`` in seq order, in one transaction, and
   publish them once it has committed (ledger/reconcile.py ``top_up``: no claim waits on
   its row locks). A crash between that commit and the publish leaves them ``queued`` with
   no message: the workers' reconciler publishes them after their grace period (60 s), as
   it does any lost message.

Batches beyond the window stay ``planned``: the workers' reconciler publishes them as
the queue drains, so Redis holds a window of the run, not the run. A run smaller than
the window is wholly ``queued`` when submit returns.

A rerun skips rows already registered (same sample id from the same source row),
publishes planned batches as the window allows (those left by a crash between 2 and 3
first), and appends new batches only for new rows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from celery import Celery
from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session, sessionmaker

from ledger import transitions
from ledger.defaults import DEFAULT_QUEUE_WINDOW
from ledger.errors import ConfigError, InputRowError
from ledger.models import Batch, RejectedRow
from ledger.object_keys import parse_s3_url
from ledger.objects import ObjectStore
from ledger.reconcile import top_up
from ledger.runs import RunRecord, get_run
from ledger.shards import encode_manifest, encode_shard, input_group_url, pack_shards, run_manifest_url
from ledger.states import BatchStatus

from .dataset.normalize import normalize_row
from .dataset.readers import iter_input_paths, iter_rows
from .run_config import RunConfig
from .submit_checks import get_or_create_run  # noqa: F401 - bench.system_run imports it from here

log = logging.getLogger(__name__)

#: Batches written per transaction and per input object. Large enough to amortise round
#: trips (≈2,000 samples and one ~0.7 MB PUT at batch size 64; a PUT costs the producer and
#: the store ~3 and ~5 ms of CPU whatever its size), small enough that a crash redoes little.
GROUP_BATCHES = 32
#: Groups read ahead of the one being committed: one being encoded and uploaded, one read
#: meanwhile, so neither writer stage waits for the reader; memory holds at most this many
#: groups plus the one being committed.
GROUPS_AHEAD = 2
DUPLICATE_REASON = "duplicate_id"
#: Rejected rows a submit shows (``regen status --rejected`` lists them all): a screenful.
FIRST_REJECTS_SHOWN = 10

#: The group's ids already in the ledger: one primary-key probe per id (the LATERAL ... LIMIT 1
#: keeps the planner from flattening it). ``sample_id = ANY(:ids)`` let the planner, whose
#: statistics lag a table that a submit grows from nothing, scan every sample of the run
#: and filter: ~95 ms per group at 900K samples (~6 ms probed), and quadratic over a submit.
_KNOWN_SAMPLES = text(
    "SELECT s.sample_id, s.source_file, s.source_row FROM unnest(CAST(:ids AS text[])) AS wanted(id) "
    "CROSS JOIN LATERAL (SELECT sample_id, source_file, source_row FROM samples "
    "WHERE run_id = :run AND sample_id = wanted.id LIMIT 1) AS s")


class SubmitInProgress(ConfigError):
    """Another submit of the run holds its lock."""


class NoSamples(ConfigError):
    """Every row of a new run's input was rejected: the run would sit active with nothing to do."""


def _no_samples_message(report: SubmitReport) -> str:
    from .monitoring.rejected import reject_line

    shown = "\n".join("  " + reject_line(r) for r in report.first_rejects)
    more = report.rejected + report.duplicates - len(report.first_rejects)
    return (f"no row of the input became a sample ({report.rows_read:,} rows read, all rejected), so run "
            f"{report.run!r} was not created. The first rejected rows (file:row reason detail):\n{shown}"
            + (f"\n  ... and {more:,} more" if more > 0 else "")
            + "\nFix those rows (docs/formats.md says what a row must hold), then submit again.")


@dataclass
class SubmitReport:
    run: str
    created: bool
    rows_read: int = 0
    samples_new: int = 0
    samples_known: int = 0
    rejected: int = 0
    duplicates: int = 0
    batches_new: int = 0
    #: Planned batches of an earlier submit that this one published (a crash, or the window).
    batches_republished: int = 0
    #: Batches this submit published (``queued``), and those it left ``planned`` beyond the window.
    batches_published: int = 0
    batches_planned: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)
    #: The first rejected rows (at most FIRST_REJECTS_SHOWN), ``{file, row, reason, detail}`` each: what submit shows.
    first_rejects: list[dict] = field(default_factory=list)
    #: Seconds spent per phase; reading overlaps the writer's phases, so they add up to more than the wall time.
    timings_s: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings_s[phase] = round(self.timings_s.get(phase, 0.0) + time.perf_counter() - start, 3)


@dataclass
class _Reject:
    file: str
    row: int
    reason: str
    detail: str


def _samples_from(paths: Iterable[str], rejects: list[_Reject], report: SubmitReport) -> Iterator[dict]:
    for raw in iter_rows(paths):
        report.rows_read += 1
        if raw.error is not None:
            rejects.append(_Reject(raw.file, raw.row, raw.error.reason, raw.error.detail))
            continue
        try:
            sample = normalize_row(raw.obj)
        except InputRowError as e:
            rejects.append(_Reject(raw.file, raw.row, e.reason, e.detail))
            continue
        sample["source"] = {"file": raw.file, "row": raw.row}
        yield sample


def _legacy_source(source: tuple[str, int]) -> tuple[str, int] | None:
    """A source recorded as typed (before files were keyed by resolved path), resolved from here."""
    return None if os.path.isabs(source[0]) else (str(Path(source[0]).resolve()), source[1])


class _Submitter:
    """Plans groups on the calling (reader) thread and writes them in order: an uploader thread
    writes each group's input object, then the writer thread commits and publishes it."""

    def __init__(self, sessions: sessionmaker[Session], app: Celery, store: ObjectStore, run: RunRecord,
                 report: SubmitReport, *, window: int):
        self.sessions, self.app, self.store, self.run, self.report = sessions, app, store, run, report
        self.window = window
        with sessions() as s:
            self.next_seq = (s.scalar(select(func.max(Batch.seq)).where(Batch.run_id == run.id)) or 0) + 1
        # Sample ids read but not yet committed (the carry of a partial batch, groups in the
        # writer), so a duplicate is caught even before its first occurrence reaches the ledger.
        self.unwritten: dict[str, tuple[str, int]] = {}
        # Held by the dedupe (query, then look in `unwritten`) and by the writer when it drops
        # committed ids: an id is then always in `unwritten` or visible to the query, never neither.
        self._ids_lock = threading.Lock()
        self._uploader = ThreadPoolExecutor(1, thread_name_prefix="submit-upload")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="submit-writer")
        self._in_writer: deque[Future] = deque()
        self._failed = threading.Event()

    def close(self) -> None:
        """Stop: groups not started are dropped (a rerun registers their rows), the current one finishes."""
        # The writer first: its current group may still wait for its upload, which finishes.
        self._writer.shutdown(wait=True, cancel_futures=True)
        self._uploader.shutdown(wait=True, cancel_futures=True)

    # -- dedupe -------------------------------------------------------------------------
    def split_known(self, samples: list[dict], rejects: list[_Reject]) -> list[dict]:
        """Drop rows registered by an earlier submit and duplicates of an id seen before."""
        ids = list({s["sample_id"] for s in samples})
        fresh: list[dict] = []
        with self._ids_lock, self.sessions() as s:
            rows = s.execute(_KNOWN_SAMPLES, {"run": self.run.id, "ids": ids}).all()
            known = {r.sample_id: (r.source_file, r.source_row) for r in rows}
            for sample in samples:
                src = (sample["source"]["file"], sample["source"]["row"])
                first = known.get(sample["sample_id"]) or self.unwritten.get(sample["sample_id"])
                if first is None:
                    self.unwritten[sample["sample_id"]] = src
                    fresh.append(sample)
                elif first == src or _legacy_source(first) == src:
                    self.report.samples_known += 1  # the same row, submitted again
                else:
                    rejects.append(_Reject(src[0], src[1], DUPLICATE_REASON,
                                           f"sample id {sample['sample_id'][:80]!r} first seen at {first[0]}:{first[1]}"))
        return fresh

    # -- groups -------------------------------------------------------------------------
    def add_group(self, batches: list[list[dict]], rejects: list[_Reject]) -> None:
        """Number the group's batches and queue it for the writer; waits while the writer is behind."""
        # The group's batches share one input object, named by the first of them.
        key = input_group_url(self.run.output_url, self.next_seq)
        planned = []
        for rows in batches:
            planned.append((self.next_seq, key, rows))
            self.next_seq += 1
        group_rejects = list(rejects)
        rejects.clear()
        while len(self._in_writer) > GROUPS_AHEAD:
            with self.report.timed("reader_waits_for_writer"):
                self._in_writer.popleft().result()
        uploaded = self._uploader.submit(self._upload_group, planned)
        self._in_writer.append(self._writer.submit(self._write_group, planned, uploaded, group_rejects))

    def finish(self) -> None:
        """Wait for every queued group; raises the first writer failure."""
        while self._in_writer:
            with self.report.timed("reader_waits_for_writer"):
                self._in_writer.popleft().result()

    def _upload_group(self, planned: list[tuple[int, str, list[dict]]]) -> list[tuple[int, int, str]] | None:
        """Step 1 (module docstring): the group's input object. Its batches' ranges; None once a group failed."""
        if self._failed.is_set():
            return None  # an earlier group failed: nothing after it is written, the reader raises its error
        try:
            with self.report.timed("encode_and_upload"):
                data, ranges = pack_shards([encode_shard(rows) for _, _, rows in planned])
                self.store.put(planned[0][1], data)
            return ranges
        except BaseException:
            self._failed.set()
            raise

    def _write_group(self, planned: list[tuple[int, str, list[dict]]], uploaded: Future,
                     rejects: list[_Reject]) -> None:
        """Steps 2 and 3, once the group's object is uploaded: never before, never out of order."""
        if self._failed.is_set():
            return
        try:
            ranges = uploaded.result()  # raises the upload's error
            if ranges is not None:
                self._commit_and_publish(planned, ranges, rejects)
        except BaseException:
            self._failed.set()
            raise

    def _commit_and_publish(self, planned: list[tuple[int, str, list[dict]]], ranges: list[tuple[int, int, str]],
                            rejects: list[_Reject]) -> None:
        # 2. one transaction; 3. mark queued, commit, then publish (see the module docstring).
        with self.report.timed("ledger_write"), self.sessions.begin() as s:
            batch_ids = transitions.insert_batches(s, self.run.id,
                                                   [(seq, key, len(rows)) for seq, key, rows in planned],
                                                   input_ranges=ranges)
            transitions.copy_pending_samples(s, self.run.id, (
                (r["sample_id"], batch_id, r["source"]["file"], r["source"]["row"])
                for batch_id, (_, _, rows) in zip(batch_ids, planned, strict=True) for r in rows))
            self._write_rejects(s, rejects)
            # New work: a finished run is active again now, so that the window takes its batches.
            transitions.reactivate_run(s, self.run.id)
        with self._ids_lock:
            for _, _, rows in planned:
                for r in rows:
                    self.unwritten.pop(r["sample_id"], None)
        self.report.batches_new += len(planned)
        self.report.samples_new += sum(len(p[2]) for p in planned)
        self.publish()

    def _write_rejects(self, s: Session, rejects: list[_Reject]) -> None:
        if not rejects:
            return
        # A detail may quote the row (a parser's message): NUL, which Postgres text refuses, escaped as JSON does.
        values = [{"run_id": self.run.id, "source_file": r.file, "source_row": r.row, "reason": r.reason,
                   "detail": r.detail[:1000].replace("\x00", "\\u0000")} for r in rejects]
        s.execute(pg_insert(RejectedRow).values(values).on_conflict_do_nothing(
            constraint="rejected_rows_source_key"))
        for r in rejects:
            key = "duplicates" if r.reason == DUPLICATE_REASON else "rejected"
            setattr(self.report, key, getattr(self.report, key) + 1)
            self.report.reject_reasons[r.reason] = self.report.reject_reasons.get(r.reason, 0) + 1
            if len(self.report.first_rejects) < FIRST_REJECTS_SHOWN:
                self.report.first_rejects.append({"file": r.file, "row": r.row, "reason": r.reason,
                                                  "detail": r.detail[:300]})

    def flush_rejects(self, rejects: list[_Reject]) -> None:
        with self.sessions.begin() as s:
            self._write_rejects(s, rejects)
        rejects.clear()

    def publish(self) -> int:
        """Step 3: the run's planned batches, in seq order, as far as the queue's window has room."""
        with self.report.timed("publish"):
            published = top_up(self.sessions, self.app, window=self.window, run_id=self.run.id)
        self.report.batches_published += published
        return published

    def planned_left(self) -> int:
        with self.sessions() as s:
            return s.scalar(select(func.count()).select_from(Batch).where(
                Batch.run_id == self.run.id, Batch.status == BatchStatus.PLANNED.value)) or 0


def submit_run(sessions: sessionmaker[Session], app: Celery, store: ObjectStore, paths: list[str], *,
               run_name: str, config: RunConfig, output_url: str, batch_size: int, queue: str,
               quality_thresholds: dict | None = None, window: int = DEFAULT_QUEUE_WINDOW,
               benchmark: bool = False) -> SubmitReport:
    """Register ``paths`` as the run ``run_name`` (or resume it), write its input shards, publish its batches.

    ``regen submit`` checks what it can first (producer/submit_checks.py). A run this call created
    and that got no batch before a failure (S3 or Redis gone, Ctrl-C) is deleted again, so the same
    submit, corrected, creates it anew; one that got batches is resumed by the same submit.
    ``benchmark``: a fake engine may serve the run (worker/engine/fake.py).

    Raises:
        ConfigError: a refused argument or run configuration, or another submit of the run in progress.
        StoreError, and the broker's and Postgres's errors: a step failed (the run rolled back as above).
    """
    if batch_size <= 0:
        raise ConfigError("--batch-size must be positive")
    if not output_url.startswith("s3://"):
        raise ConfigError(f"--output must be an s3:// URL, got {output_url!r}")
    parse_s3_url(output_url)  # a bad bucket name is refused before the run exists
    iter_input_paths(paths)  # and a missing input path
    with sessions.begin() as s:
        run, created = get_or_create_run(s, run_name, config, output_url=output_url, queue=queue,
                                         batch_size=batch_size, quality_thresholds=quality_thresholds,
                                         benchmark=benchmark)
        run_id = run.id
    try:
        return _submit_into(sessions, app, store, paths, run_id=run_id, run_name=run_name, created=created,
                            batch_size=batch_size, window=window)
    except SubmitInProgress:
        raise  # the run is the other submit's now: never deleted from under it
    except BaseException:
        if created:
            _forget_empty_run(sessions, run_id, run_name)
        raise


def _forget_empty_run(sessions: sessionmaker[Session], run_id: int, run_name: str) -> None:
    """Delete the run this submit created, if it has no batch yet: a failed first submit leaves nothing."""
    try:
        with sessions.begin() as s:  # cascades to its rejected rows; a batch means the run is kept
            gone = s.execute(text("DELETE FROM runs WHERE id = :id AND NOT EXISTS "
                                  "(SELECT 1 FROM batches WHERE run_id = :id) RETURNING id"), {"id": run_id}).first()
        log.info("run %s, created by this failed submit: %s", run_name, "removed" if gone else "kept (batches)")
    except Exception as e:  # noqa: BLE001 - the submit's own error is the one to report
        log.warning("run %s, created by this failed submit, not removed (%s): `regen clean --run %s --ledger --yes`",
                    run_name, type(e).__name__, run_name)


def _submit_into(sessions: sessionmaker[Session], app: Celery, store: ObjectStore, paths: list[str], *,
                 run_id: int, run_name: str, created: bool, batch_size: int, window: int) -> SubmitReport:
    report = SubmitReport(run=run_name, created=created)
    # One submit per run at a time: two would number their batches alike. A transaction-level
    # lock in a transaction left open (no snapshot held: it runs no query after this) for the
    # whole submit: released by the rollback of close(), whatever happens, and it works through
    # PgBouncer in transaction mode, where a session-level lock would stay behind on a pooled
    # server connection (docs/deploy.md, "Connections").
    lock_conn = sessions.kw["bind"].connect()
    try:
        if not lock_conn.execute(text("SELECT pg_try_advisory_xact_lock(8151, :r)"), {"r": run_id}).scalar():
            raise SubmitInProgress(f"another submit of run {run_name!r} is in progress")
        with sessions() as s:
            run = get_run(s, run_id)
        if created:
            store.put(run_manifest_url(run.output_url), encode_manifest(run))
        submitter = _Submitter(sessions, app, store, run, report, window=window)
        try:
            # A paused run publishes nothing: `regen resume` does, and the reconciler then.
            report.batches_republished = submitter.publish()
            _stream_into_batches(submitter, _samples_from(paths, rejects := [], report), rejects, batch_size)
        finally:
            submitter.close()
        report.batches_planned = submitter.planned_left()
        if created and not report.samples_new and not report.samples_known:
            raise NoSamples(_no_samples_message(report))  # the run, without a batch, is deleted
        if report.batches_new or report.batches_republished:
            with sessions.begin() as s:
                transitions.reactivate_run(s, run_id)
    finally:
        lock_conn.close()  # rolls its transaction back: the lock goes with it
    log.info("submit %s: %s", run_name, report)
    return report


def _stream_into_batches(submitter: _Submitter, samples: Iterator[dict], rejects: list[_Reject],
                         batch_size: int) -> None:
    report = submitter.report
    group_rows = batch_size * GROUP_BATCHES
    carry: list[dict] = []      # new samples not yet in a full batch
    window: list[dict] = []     # rows read, not yet deduplicated
    start = time.perf_counter()
    for sample in samples:
        window.append(sample)
        if len(window) >= group_rows:
            with report.timed("dedupe"):
                carry.extend(submitter.split_known(window, rejects))
            window = []
            full = len(carry) // batch_size * batch_size
            if full:
                submitter.add_group([carry[i:i + batch_size] for i in range(0, full, batch_size)], rejects)
                carry = carry[full:]
    if window:
        with report.timed("dedupe"):
            carry.extend(submitter.split_known(window, rejects))
    if carry:
        submitter.add_group([carry[i:i + batch_size] for i in range(0, len(carry), batch_size)], rejects)
    reading_s = time.perf_counter() - start
    submitter.finish()
    if rejects:
        submitter.flush_rejects(rejects)
    # The reader's own work: everything it did but deduplicate and wait for the writer.
    timings = report.timings_s
    timings["read_and_normalize"] = round(reading_s - timings.get("dedupe", 0.0)
                                          - timings.get("reader_waits_for_writer", 0.0), 3)
