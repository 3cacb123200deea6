"""``regen retry``: run again, on request, what failed: dead batches or failed samples.

Never automatic: a batch is dead or a sample failed for a recorded reason, and a
human decides whether a retry can help (a fixed bug, a larger context). Sampling
never changes on a retry (no raised temperature): the run's config is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from ledger import transitions
from ledger.dispatch import BatchMessage, publish_messages
from ledger.models import Batch
from ledger.objects import ObjectStore
from ledger.runs import find_run
from ledger.shards import InputSlice, decode_shard, encode_shard, input_shard_url, read_input_shard
from ledger.states import BatchStatus


@dataclass
class RetryReport:
    dead_batches: int = 0
    failed_samples: int = 0
    new_batches: int = 0


def retry_dead(sessions: sessionmaker[Session], app: Celery, run_name: str) -> int:
    with sessions.begin() as s:
        run = find_run(s, run_name)
        rows = transitions.revive_dead(s, run.id)
        if rows:
            transitions.reactivate_run(s, run.id)
    publish_messages(app, [BatchMessage(run=run.name, run_id=run.id, batch_id=r.id, seq=r.seq, input_key=r.input_key)
                           for r in rows], queue=run.queue)
    return len(rows)


def retry_failed(sessions: sessionmaker[Session], app: Celery, store: ObjectStore, run_name: str) -> RetryReport:
    """Move every failed sample into new batches (new input shards, new keys) and enqueue them."""
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
        seq = next_seq
        next_seq += 1
        key = input_shard_url(run.output_url, seq)
        store.put(key, encode_shard(chunk))
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
