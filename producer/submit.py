"""``regen submit``: register a dataset as a run, write input shards, enqueue batches.

The producer streams the input (a 914K-row dataset is never held in memory), and
works in *groups* of batches so there is no round trip per row: one dedupe query,
parallel shard uploads, one transaction (COPY) and one publish burst per group.

Order of effects, so that a crash anywhere is finished by running the same submit
again (and nothing is enqueued twice):

1. upload the group's input shards (unreferenced objects may be overwritten later);
2. one transaction: batches (status ``planned``) + samples + rejected rows;
3. publish the messages, then mark the batches ``queued``.

A rerun skips rows already registered (same sample id from the same source row),
publishes batches left ``planned`` by a crash between 2 and 3, and appends new
batches only for new rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from celery import Celery
from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session, sessionmaker

from ledger.dispatch import BatchMessage, publish_batch
from ledger.errors import ConfigError, InputRowError
from ledger.models import Batch, RejectedRow, Run
from ledger.objects import ObjectStore
from ledger.shards import encode_shard, input_shard_url, run_manifest_url
from ledger.states import BatchStatus, RunStatus

from .normalize import normalize_row
from .readers import iter_rows
from .run_config import RunConfig

log = logging.getLogger(__name__)

#: Batches written per transaction. Large enough to amortise round trips
#: (≈1,000 samples at batch size 64), small enough that a crash redoes little.
GROUP_BATCHES = 16
#: Parallel input-shard uploads: S3 latency, not bandwidth, bounds a submit.
UPLOAD_THREADS = 8
DUPLICATE_REASON = "duplicate_id"


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
    batches_republished: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class _Reject:
    file: str
    row: int
    reason: str
    detail: str


def get_or_create_run(session: Session, name: str, config: RunConfig, *, output_url: str, queue: str,
                      batch_size: int) -> tuple[Run, bool]:
    run = session.scalar(select(Run).where(Run.name == name))
    if run is None:
        run = Run(name=name, model=config.model, sampling=config.as_record(), config_hash=config.hash,
                  output_url=output_url.rstrip("/"), queue=queue, batch_size=batch_size,
                  status=RunStatus.ACTIVE.value, provenance={"model_files": config.model_files})
        session.add(run)
        session.flush()
        return run, True
    if run.config_hash != config.hash:
        diffs = []
        if run.model != config.model:
            diffs.append(f"model {run.model!r} != {config.model!r}")
        for key, value in config.as_record().items():
            if run.sampling.get(key) != value:
                diffs.append(f"{key} {run.sampling.get(key)!r} != {value!r}")
        if not diffs:
            diffs.append("the model's files changed since the run was created")
        raise ConfigError(f"run {name!r} exists with another configuration ({'; '.join(diffs)}); "
                          "choose a new run name for a new model or sampling config")
    if run.output_url != output_url.rstrip("/"):
        raise ConfigError(f"run {name!r} writes to {run.output_url}, not {output_url}")
    if run.batch_size != batch_size:
        raise ConfigError(f"run {name!r} was created with --batch-size {run.batch_size}")
    return run, False


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


class _Submitter:
    def __init__(self, sessions: sessionmaker[Session], app: Celery, store: ObjectStore, run: Run,
                 report: SubmitReport):
        self.sessions, self.app, self.store, self.run, self.report = sessions, app, store, run, report
        with sessions() as s:
            self.next_seq = (s.scalar(select(func.max(Batch.seq)).where(Batch.run_id == run.id)) or 0) + 1
        # Sample ids read but not yet committed (the carry of a partial batch), so a
        # duplicate is caught even before its first occurrence reaches the ledger.
        self.unwritten: dict[str, tuple[str, int]] = {}

    # -- dedupe -------------------------------------------------------------------------
    def _split_known(self, samples: list[dict], rejects: list[_Reject]) -> list[dict]:
        """Drop rows registered by an earlier submit and duplicates of an id seen before."""
        ids = list({s["sample_id"] for s in samples})
        with self.sessions() as s:
            rows = s.execute(
                text("SELECT sample_id, source_file, source_row FROM samples "
                     "WHERE run_id = :run AND sample_id = ANY(:ids)"),
                {"run": self.run.id, "ids": ids},
            ).all()
        known = {r.sample_id: (r.source_file, r.source_row) for r in rows}
        fresh: list[dict] = []
        for sample in samples:
            src = (sample["source"]["file"], sample["source"]["row"])
            first = known.get(sample["sample_id"]) or self.unwritten.get(sample["sample_id"])
            if first is None:
                self.unwritten[sample["sample_id"]] = src
                fresh.append(sample)
            elif first == src:
                self.report.samples_known += 1  # the same row, submitted again
            else:
                rejects.append(_Reject(src[0], src[1], DUPLICATE_REASON,
                                       f"sample id {sample['sample_id'][:80]!r} first seen at {first[0]}:{first[1]}"))
        return fresh

    # -- one group ----------------------------------------------------------------------
    def write_group(self, batches: list[list[dict]], rejects: list[_Reject]) -> None:
        planned = []
        for rows in batches:
            seq = self.next_seq
            self.next_seq += 1
            planned.append((seq, input_shard_url(self.run.output_url, seq), rows))
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            list(pool.map(lambda p: self.store.put(p[1], encode_shard(p[2])), planned))
        with self.sessions.begin() as s:
            batch_ids = []
            for seq, key, rows in planned:
                batch = Batch(run_id=self.run.id, seq=seq, status=BatchStatus.PLANNED.value, input_key=key,
                              n_samples=len(rows), attempts=0)
                s.add(batch)
                s.flush()
                batch_ids.append(batch.id)
            raw = s.connection().connection.driver_connection
            with raw.cursor() as cur, cur.copy(
                "COPY samples (run_id, sample_id, batch_id, source_file, source_row, status) FROM STDIN"
            ) as copy:
                for batch_id, (_, _, rows) in zip(batch_ids, planned, strict=True):
                    for r in rows:
                        copy.write_row((self.run.id, r["sample_id"], batch_id, r["source"]["file"],
                                        r["source"]["row"], "pending"))
            self._write_rejects(s, rejects)
        rejects.clear()
        for _, _, rows in planned:
            for r in rows:
                self.unwritten.pop(r["sample_id"], None)
        self.report.batches_new += len(planned)
        self.report.samples_new += sum(len(p[2]) for p in planned)
        self.publish([(bid, seq, key) for bid, (seq, key, _) in zip(batch_ids, planned, strict=True)])

    def _write_rejects(self, s: Session, rejects: list[_Reject]) -> None:
        if not rejects:
            return
        values = [{"run_id": self.run.id, "source_file": r.file, "source_row": r.row, "reason": r.reason,
                   "detail": r.detail[:1000]} for r in rejects]
        s.execute(pg_insert(RejectedRow).values(values).on_conflict_do_nothing(
            constraint="rejected_rows_source_key"))
        for r in rejects:
            key = "duplicates" if r.reason == DUPLICATE_REASON else "rejected"
            setattr(self.report, key, getattr(self.report, key) + 1)
            self.report.reject_reasons[r.reason] = self.report.reject_reasons.get(r.reason, 0) + 1

    def flush_rejects(self, rejects: list[_Reject]) -> None:
        with self.sessions.begin() as s:
            self._write_rejects(s, rejects)
        rejects.clear()

    def publish(self, batches: list[tuple[int, int, str]]) -> None:
        for batch_id, seq, key in batches:
            publish_batch(self.app, BatchMessage(run=self.run.name, run_id=self.run.id, batch_id=batch_id,
                                                 seq=seq, input_key=key), queue=self.run.queue)
        with self.sessions.begin() as s:
            s.execute(update(Batch).where(Batch.id.in_([b[0] for b in batches]),
                                          Batch.status == BatchStatus.PLANNED.value)
                      .values(status=BatchStatus.QUEUED.value, enqueued_at=func.now()))

    def republish_planned(self) -> int:
        with self.sessions() as s:
            rows = s.execute(select(Batch.id, Batch.seq, Batch.input_key).where(
                Batch.run_id == self.run.id, Batch.status == BatchStatus.PLANNED.value).order_by(Batch.seq)).all()
        for i in range(0, len(rows), 500):
            self.publish([(r.id, r.seq, r.input_key) for r in rows[i:i + 500]])
        return len(rows)


def submit_run(sessions: sessionmaker[Session], app: Celery, store: ObjectStore, paths: list[str], *,
               run_name: str, config: RunConfig, output_url: str, batch_size: int, queue: str) -> SubmitReport:
    if batch_size <= 0:
        raise ConfigError("--batch-size must be positive")
    if not output_url.startswith("s3://"):
        raise ConfigError(f"--output must be an s3:// URL, got {output_url!r}")
    with sessions.begin() as s:
        run, created = get_or_create_run(s, run_name, config, output_url=output_url, queue=queue,
                                         batch_size=batch_size)
        run_id = run.id
    report = SubmitReport(run=run_name, created=created)
    # One submit per run at a time: two would number their batches alike.
    lock_conn = sessions.kw["bind"].connect()
    try:
        if not lock_conn.execute(text("SELECT pg_try_advisory_lock(8151, :r)"), {"r": run_id}).scalar():
            raise ConfigError(f"another submit of run {run_name!r} is in progress")
        with sessions() as s:
            run = s.get(Run, run_id)
        if created:
            store.put(run_manifest_url(run.output_url), encode_manifest(run))
        submitter = _Submitter(sessions, app, store, run, report)
        report.batches_republished = submitter.republish_planned()
        _stream_into_batches(submitter, _samples_from(paths, rejects := [], report), rejects, batch_size)
        if report.batches_new or report.batches_republished:
            with sessions.begin() as s:
                s.execute(update(Run).where(Run.id == run_id, Run.status == RunStatus.FINISHED.value)
                          .values(status=RunStatus.ACTIVE.value))
    finally:
        lock_conn.close()
    log.info("submit %s: %s", run_name, report)
    return report


def _stream_into_batches(submitter: _Submitter, samples: Iterator[dict], rejects: list[_Reject],
                         batch_size: int) -> None:
    group_rows = batch_size * GROUP_BATCHES
    carry: list[dict] = []      # new samples not yet in a full batch
    window: list[dict] = []     # rows read, not yet deduplicated
    for sample in samples:
        window.append(sample)
        if len(window) >= group_rows:
            carry.extend(submitter._split_known(window, rejects))
            window = []
            full = len(carry) // batch_size * batch_size
            if full:
                submitter.write_group([carry[i:i + batch_size] for i in range(0, full, batch_size)], rejects)
                carry = carry[full:]
    if window:
        carry.extend(submitter._split_known(window, rejects))
    if carry:
        submitter.write_group([carry[i:i + batch_size] for i in range(0, len(carry), batch_size)], rejects)
    if rejects:
        submitter.flush_rejects(rejects)


def encode_manifest(run: Run) -> bytes:
    import json

    return json.dumps({"run": run.name, "model": run.model, "sampling": run.sampling,
                       "config_hash": run.config_hash, "provenance": run.provenance,
                       "created_at": run.created_at.isoformat() if run.created_at else None},
                      indent=2, sort_keys=True).encode()
