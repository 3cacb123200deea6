"""Rebuild the broker's view from the ledger: the ledger is the truth, Redis a dispatch channel.

Two kinds of batches need a message that the broker may not have:

* ``running`` batches whose lease expired: their worker died (node crash, SIGKILL,
  network partition) and the broker will redeliver its message only after the
  visibility timeout (hours). They go back to ``queued`` as a failed attempt
  (``failures + 1``, ``dead`` at the limit, so a batch that kills every worker that
  takes it cannot loop forever) and get a new message.
* ``queued`` (and ``planned``) batches whose message is gone (Redis flushed or
  restarted empty). ``regen requeue`` republishes them all; the automatic
  reconciler in the workers republishes them only when the broker is visibly empty
  (no message in the queue and none unacknowledged) and they have waited longer
  than a grace period, so it never floods a healthy queue with duplicates.

Duplicate messages are harmless: a claim is fenced by ``attempts`` and a batch that
is running elsewhere, done or dead is acknowledged without generating.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from celery import Celery
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from . import transitions
from .defaults import DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS, QUEUED_GRACE_S  # noqa: F401 (re-exported)
from .dispatch import BatchMessage, publish_messages

log = logging.getLogger(__name__)

#: One reconciler pass at a time across all workers (pg advisory lock key).
RECONCILER_LOCK = 727463


@dataclass
class RequeueReport:
    expired: int = 0
    dead: int = 0
    republished: int = 0
    runs: list[str] = field(default_factory=list)


def expire_leases(session: Session, *, lease_s: float, max_attempts: int, run: str | None = None) -> tuple[int, int]:
    """Expire lost leases (see ledger/transitions.py): (expired, of them now dead)."""
    rows = transitions.expire_leases(session, lease_s=lease_s, max_attempts=max_attempts, run=run)
    return len(rows), sum(1 for r in rows if r.status == "dead")


def _queued(session: Session, *, run: str | None, older_than_s: float) -> list:
    return session.execute(text("""
        SELECT b.id, b.seq, b.input_key, r.id AS run_id, r.name, r.queue FROM batches b JOIN runs r ON r.id = b.run_id
        WHERE b.status IN ('queued', 'planned') AND r.status <> 'paused'
          AND (CAST(:run AS text) IS NULL OR r.name = :run)
          AND coalesce(b.enqueued_at, '-infinity') < now() - make_interval(secs => :age)
        ORDER BY r.id, b.seq"""), {"run": run, "age": older_than_s}).all()


def _publish(sessions: sessionmaker[Session], app: Celery, rows: list) -> int:
    by_queue: dict[str, list[BatchMessage]] = {}
    for r in rows:
        by_queue.setdefault(r.queue, []).append(
            BatchMessage(run=r.name, run_id=r.run_id, batch_id=r.id, seq=r.seq, input_key=r.input_key))
    for queue, messages in by_queue.items():
        publish_messages(app, messages, queue=queue)
    if rows:
        with sessions.begin() as s:
            transitions.mark_republished(s, [r.id for r in rows])
    return len(rows)


def requeue(sessions: sessionmaker[Session], app: Celery, *, run: str | None, lease_s: float,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> RequeueReport:
    """``regen requeue``: expire lost leases and republish every queued batch (after a Redis loss)."""
    report = RequeueReport()
    with sessions.begin() as s:
        report.expired, report.dead = expire_leases(s, lease_s=lease_s, max_attempts=max_attempts, run=run)
    with sessions() as s:
        rows = _queued(s, run=run, older_than_s=0)
    report.republished = _publish(sessions, app, rows)
    report.runs = sorted({r.name for r in rows})
    return report


def broker_is_empty(app: Celery, queues: list[str]) -> bool:
    """No message waiting in any of ``queues`` and none unacknowledged anywhere."""
    with app.connection_for_write() as conn:
        client = conn.default_channel.client
        if client.hlen("unacked"):
            return False
        return all(client.llen(q) == 0 for q in queues)


def reconcile_once(sessions: sessionmaker[Session], app: Celery, *, lease_s: float, max_attempts: int,
                   grace_s: float = QUEUED_GRACE_S) -> RequeueReport | None:
    """One automatic pass (workers run it periodically). None if another worker holds the pass."""
    report = RequeueReport()
    with sessions.begin() as s:
        if not s.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": RECONCILER_LOCK}).scalar():
            return None
        expired = transitions.expire_leases(s, lease_s=lease_s, max_attempts=max_attempts)
        report.expired = len(expired)
        report.dead = sum(1 for r in expired if r.status == "dead")
        expired_ids = {r.id for r in expired if r.status == "queued"}
        rows = _queued(s, run=None, older_than_s=grace_s)
    # Expired batches always get a new message; other queued ones only if the broker lost them.
    queues = sorted({r.queue for r in rows})
    if rows and not broker_is_empty(app, queues):
        rows = [r for r in rows if r.id in expired_ids]
    with sessions() as s:
        if expired_ids:
            fresh = _queued(s, run=None, older_than_s=0)
            have = {r.id for r in rows}
            rows += [r for r in fresh if r.id in expired_ids and r.id not in have]
    report.republished = _publish(sessions, app, rows)
    if report.expired or report.republished:
        log.warning("reconciler: %d leases expired (%d now dead), %d batches republished", report.expired,
                    report.dead, report.republished)
    return report
