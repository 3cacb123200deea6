"""``regen retry``: run again, on request, what failed: dead batches or failed samples.

Never automatic: a batch is dead or a sample failed for a recorded reason, and a
human decides whether a retry can help (a fixed bug, a larger context). Sampling
never changes on a retry (no raised temperature): the run's config is fixed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from celery import Celery
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from ledger import transitions
from ledger.dispatch import BatchMessage, publish_messages
from ledger.errors import ShardError, StoreError
from ledger.models import Batch
from ledger.objects import ObjectStore
from ledger.output_check import batch_sample_ids, foreign_rows_reason, refusal
from ledger.runs import RunRecord, find_run
from ledger.shards import (
    InputSlice,
    decode_shard,
    encode_shard,
    input_shard_url,
    output_shard_url,
    read_input_shard,
)
from ledger.states import BatchStatus

from .submit import SubmitInProgress


@dataclass
class RetryReport:
    dead_batches: int = 0
    failed_samples: int = 0
    new_batches: int = 0


@dataclass
class DeadRetry:
    queued: int = 0
    #: Dead batches left dead, one line each: an object at their output key that can never be committed as
    #: theirs (another run's, or unreadable), which a replay would only find again.
    kept_dead: list[str] = field(default_factory=list)


def retry_dead(sessions: sessionmaker[Session], app: Celery, store: ObjectStore, run_name: str) -> DeadRetry:
    """Queue every dead batch of the run again, but those whose output key holds a shard that is not theirs."""
    report = DeadRetry()
    with sessions() as s:
        run = find_run(s, run_name)
        dead = s.execute(text("SELECT id, seq FROM batches WHERE run_id = :r AND status = 'dead' ORDER BY seq"),
                         {"r": run.id}).all()
    kept: list[int] = []
    for batch in dead:
        why = _unusable_output(sessions, store, run, batch.id, batch.seq)
        if why is not None:
            kept.append(batch.id)
            report.kept_dead.append(f"batch {batch.seq} kept dead: {why}")
    with sessions.begin() as s:
        rows = transitions.revive_dead(s, run.id, keep_dead=kept)
        if rows:
            transitions.reactivate_run(s, run.id)
    publish_messages(app, [BatchMessage(run=run.name, run_id=run.id, batch_id=r.id, seq=r.seq, input_key=r.input_key)
                           for r in rows], queue=run.queue)
    report.queued = len(rows)
    return report


def _unusable_output(sessions: sessionmaker[Session], store: ObjectStore, run: RunRecord, batch_id: int,
                     seq: int) -> str | None:
    """Why the object at a dead batch's output key could never be committed as its output; None if there is
    none, or it is the batch's own (a worker commits it as it is: ledger/output_check.py)."""
    key = output_shard_url(run.output_url, seq)
    if store.head(key) is None:
        return None
    try:
        rows = list(decode_shard(store.get(key)))
    except (ShardError, StoreError) as e:
        return f"the object at {key} cannot be read ({e}); move it away, then `regen retry --dead`"
    with sessions() as s:
        ids = batch_sample_ids(s, batch_id)
    reason = foreign_rows_reason(rows, run_name=run.name, config_hash=run.config_hash, sample_ids=ids)
    return None if reason is None else refusal(key, reason)


def retry_failed(sessions: sessionmaker[Session], app: Celery, store: ObjectStore, run_name: str) -> RetryReport:
    """Move every failed sample into new batches (new input shards, new keys) and enqueue them.

    Under the run's submit lock (producer/submit.py): a submit or another retry beside it would number
    its batches alike.

    Raises:
        SubmitInProgress: a submit or retry of the run holds the lock.
    """
    with sessions() as s:
        run_id = find_run(s, run_name).id
    with _run_lock(sessions, run_id, run_name):
        return _retry_failed(sessions, app, store, run_name)


@contextlib.contextmanager
def _run_lock(sessions: sessionmaker[Session], run_id: int, run_name: str) -> Iterator[None]:
    """The submit's lock of the run (producer/submit.py ``_submit_into``: why a transaction-level one)."""
    conn = sessions.kw["bind"].connect()
    try:
        if not conn.execute(text("SELECT pg_try_advisory_xact_lock(8151, :r)"), {"r": run_id}).scalar():
            raise SubmitInProgress(f"a submit or retry of run {run_name!r} is in progress")
        yield
    finally:
        conn.close()  # rolls its transaction back: the lock goes with it


def _retry_failed(sessions: sessionmaker[Session], app: Celery, store: ObjectStore, run_name: str) -> RetryReport:
    report = RetryReport()
    with sessions() as s:
        run = find_run(s, run_name)
        failed = s.execute(text(
            "SELECT s.sample_id, b.input_key, b.input_offset, b.input_length, b.input_sha256 "
            "FROM samples s JOIN batches b ON b.id = s.batch_id "
            "WHERE s.run_id = :run AND s.status = 'failed' ORDER BY b.seq, s.sample_id"), {"run": run.id}).all()
        next_seq = (s.scalar(select(func.max(Batch.seq)).where(Batch.run_id == run.id)) or 0) + 1
    if not failed:
        return report
    # By input shard: a batch's own object, or its range in a packed one.
    wanted: dict[InputSlice, set[str]] = {}
    for r in failed:
        wanted.setdefault(InputSlice(r.input_key, r.input_offset, r.input_length, r.input_sha256),
                          set()).add(r.sample_id)
    rows = []
    for where, ids in wanted.items():
        rows.extend(row for row in decode_shard(read_input_shard(store, where)) if row["sample_id"] in ids)
    published = []
    for i in range(0, len(rows), run.batch_size):
        chunk = rows[i:i + run.batch_size]
        data = encode_shard(chunk)
        while True:
            # Write-once: an object already at the key (a crashed retry's, which no batch names: its seq is
            # past the ledger's) is never overwritten; the batch takes the next seq instead.
            seq, key = next_seq, input_shard_url(run.output_url, next_seq)
            next_seq += 1
            put = store.put_if_absent(key, data)
            if put.created or put.matches:
                break
        with sessions.begin() as s:
            [batch_id] = transitions.insert_batches(s, run.id, [(seq, key, len(chunk))],
                                                    status=BatchStatus.QUEUED)
            transitions.retry_samples(s, run.id, batch_id, [r["sample_id"] for r in chunk])
            transitions.reactivate_run(s, run.id)
            published.append((batch_id, seq, key))
        report.failed_samples += len(chunk)
    publish_messages(app, [BatchMessage(run=run.name, run_id=run.id, batch_id=batch_id, seq=seq, input_key=key)
                           for batch_id, seq, key in published], queue=run.queue)
    report.new_batches = len(published)
    return report
