"""Keep the broker in step with the ledger: the ledger is the truth, Redis a dispatch channel.

The broker holds a **window** of each queue, not the whole backlog: ``regen submit``
publishes up to ``window`` messages per queue and leaves the rest of its batches
``planned`` in the ledger; each reconciler pass tops every queue of an active run up to
the window again, from the planned batches in (run, seq) order. Redis memory is then
bounded by the window (~15 MB per queue at 10,000), not by the run (2.6 GB of messages
for 100M samples before), and the ready list is short enough to be read.

A pass, besides the top-up, gives a new message to two kinds of batches whose message
the broker will not deliver soon:

* ``running`` batches whose lease expired: their worker died (node crash, SIGKILL,
  network partition). They go back to ``queued`` as a failed attempt (``failures + 1``,
  ``dead`` at the limit, so a batch that kills every worker that takes it cannot loop
  forever) and get a new message at the **front** of their queue. A lease whose worker
  recorded in Redis that it handed the attempt back (its release could not reach the
  ledger: ledger/handbacks.py) expires the same way with no failure counted.
* ``queued`` batches published more than ``grace_s`` ago whose message is neither
  waiting on their queue nor claimed: lost (Redis flushed or restarted empty, the
  BRPOP-to-unacked hole), or delivered to a consumer that is gone (its ``unacked``
  entries come back only after the 6-hour visibility timeout). The pass reads the head
  of the queue, as far as the oldest queued batches' messages (ledger/broker.py
  ``missing_messages``: a queue is first in, first out), and republishes, at the front,
  those of the oldest queued batches that are not there: at most ``REPUBLISH_PER_PASS``
  per queue, each at most once per grace period (``enqueued_at`` restarts, ``republishes + 1``).
  A live consumer's delivery that waits longer than the grace period for a free thread
  gets a second message too; that is harmless (below) and lets an idle worker take it.

Why not "queued and older than the grace period" alone: a waiting message is as old as
its place in the queue, so with the whole run published (or at a small farm's pace)
nearly every queued batch is older, and each pass would double the queue. Why not
"only when the broker is empty" (the rule before): a farm's ``unacked`` hash is never
empty, so a dead consumer's deliveries waited six hours. Why not track which worker
holds which delivery: the broker does not record the consumer, and the ledger would pay
a write per delivery for what a read of the short ready list tells.

Duplicate messages are harmless: a claim is fenced by ``attempts``, and a delivery of a
batch that is running elsewhere, done or dead is acknowledged without generating and
counted in ``batches.stale_deliveries``.

Every worker offers a pass every ``--reconcile-s``; one runs at a time (an advisory
lock) and at most one per interval farm-wide (``reconciler_state``), so a pass costs the
same with 1,000 workers as with one. Each query reads only the rows it may act on
(partial indexes of migration 0007, LIMITs), whatever the ledger's size, and of Redis the
pass reads a bounded head of each queue, whatever the queue's length.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from celery import Celery
from kombu.exceptions import KombuError
from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from ledger import delivery_counts, handbacks, transitions
from ledger.broker import Queued, missing_messages, ready_batch_ids, ready_length
from ledger.defaults import (  # noqa: F401 (re-exported)
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE_WINDOW,
    QUEUED_GRACE_S,
)
from ledger.dispatch import BatchMessage, publish_messages

log = logging.getLogger(__name__)

#: One reconciler pass (or top-up) at a time across all workers and submits (pg advisory lock key).
RECONCILER_LOCK = 727463
#: Lost messages republished per queue and pass: a flushed Redis's window is back in a few passes.
REPUBLISH_PER_PASS = 2000
#: `regen requeue` reads a whole queue only up to this many times the window; a longer one
#: (messages published before the window existed) is not read, and all of its queued batches
#: are republished (duplicates, harmless).
SCAN_WINDOWS = 4
#: Rows per statement when `regen requeue` republishes every queued batch.
REQUEUE_CHUNK = 5000
_BROKER_ERRORS = (KombuError, RedisError, OSError)


@dataclass
class RequeueReport:
    expired: int = 0
    dead: int = 0
    #: Of the expired, hand-backs whose release never reached the ledger: no failure counted (ledger/handbacks.py).
    handed_back: int = 0
    #: New messages for batches that had one: expired leases, lost or stranded messages.
    republished: int = 0
    #: Of them, queued batches whose message was neither on the queue nor claimed.
    lost: int = 0
    #: Planned batches published to fill the window.
    topped_up: int = 0
    runs: list[str] = field(default_factory=list)

    def count_expired(self, rows) -> None:
        """Count ``handbacks.expire_leases``'s rows: expired, of them now dead, of them hand-backs."""
        self.expired = len(rows)
        self.dead = sum(1 for r in rows if r.status == "dead")
        self.handed_back = sum(1 for r in rows if r.handed_back)


_MESSAGE_COLUMNS = "b.id, b.seq, b.input_key, r.id AS run_id, r.name, r.queue"

#: The next planned batches of a queue's active runs, oldest run first, in seq order.
_PLANNED = text(f"""
SELECT {_MESSAGE_COLUMNS} FROM runs r CROSS JOIN LATERAL (
    SELECT id, seq, input_key FROM batches
    WHERE run_id = r.id AND status = 'planned' ORDER BY seq LIMIT :n) b
WHERE r.queue = :queue AND r.status = 'active' AND (CAST(:run AS int) IS NULL OR r.id = :run)
ORDER BY r.id, b.seq LIMIT :n""")

#: A queue's queued batches published longest ago, whether past the grace period or not (the
#: later ones only witness the order: ledger/broker.py ``missing_messages``). A waiting message
#: sits behind those published before it, so a delivered or lost one is among the oldest:
#: reading them first finds it even when thousands wait healthily.
_OLDEST_QUEUED = text(f"""
SELECT {_MESSAGE_COLUMNS}, b.enqueued_at FROM runs r CROSS JOIN LATERAL (
    SELECT id, seq, input_key, enqueued_at FROM batches
    WHERE run_id = r.id AND status = 'queued' AND enqueued_at IS NOT NULL ORDER BY enqueued_at LIMIT :n) b
WHERE r.queue = :queue AND r.status = 'active'
ORDER BY b.enqueued_at LIMIT :n""")

_DUE = text("SELECT now() - make_interval(secs => :grace)")

#: The publish times of queued batches seen at the head of a queue (the witnesses of its order).
_ENQUEUED_AT = text("SELECT id, enqueued_at FROM batches WHERE id = ANY(:ids) AND status = 'queued'")

_ACTIVE_QUEUES = text("SELECT DISTINCT queue FROM runs WHERE status = 'active' "
                      "AND (CAST(:run AS int) IS NULL OR id = :run) ORDER BY queue")

_BY_ID = text(f"SELECT {_MESSAGE_COLUMNS} FROM batches b JOIN runs r ON r.id = b.run_id WHERE b.id = ANY(:ids)")

#: `regen requeue`: the queued batches of active runs, by id from a keyset cursor.
_QUEUED_AFTER = text(f"""
SELECT {_MESSAGE_COLUMNS} FROM batches b JOIN runs r ON r.id = b.run_id
WHERE b.status = 'queued' AND r.status <> 'paused' AND (CAST(:run AS text) IS NULL OR r.name = :run)
  AND b.id > :after
ORDER BY b.id LIMIT :n""")

#: One pass per interval farm-wide: true (and the row stamped) if none ran within ``interval``.
_TAKE_PASS = text("""
INSERT INTO reconciler_state AS s (id, last_pass_at, last_pass_by) VALUES (1, now(), :by)
ON CONFLICT (id) DO UPDATE SET last_pass_at = now(), last_pass_by = :by
WHERE s.last_pass_at <= now() - make_interval(secs => :interval)
RETURNING id""")


def _messages(rows) -> list[BatchMessage]:
    return [BatchMessage(run=r.name, run_id=r.run_id, batch_id=r.id, seq=r.seq, input_key=r.input_key) for r in rows]


def _publish_by_queue(app: Celery, rows, *, front: bool) -> None:
    by_queue: dict[str, list] = {}
    for r in rows:
        by_queue.setdefault(r.queue, []).append(r)
    for queue, queue_rows in by_queue.items():
        _publish(app, queue_rows, queue=queue, front=front)


def _publish(app: Celery, rows, *, queue: str, front: bool = False) -> None:
    # At the front each message goes ahead of the one before: reversed, the first row is delivered first.
    publish_messages(app, _messages(rows[::-1] if front else rows), queue=queue, front=front)


@contextlib.contextmanager
def broker_client(app: Celery) -> Iterator:
    """The broker's redis-py client, from the app's connection pool."""
    with app.connection_for_write() as conn:
        yield conn.default_channel.client


def expire_leases(session: Session, client, *, lease_s: float, max_attempts: int,
                  run: str | None = None) -> tuple[int, int, int]:
    """Expire lost leases: (expired, of them now dead, of them hand-backs that count no failure: ledger/handbacks.py).

    ``client``: the broker's redis-py client, where the hand-back records are.
    """
    report = RequeueReport()
    report.count_expired(handbacks.expire_leases(session, client, lease_s=lease_s, max_attempts=max_attempts, run=run))
    return report.expired, report.dead, report.handed_back


def top_up(sessions: sessionmaker[Session], app: Celery, *, window: int, run_id: int | None = None) -> int:
    """Fill the window of every queue of an active run (or of ``run_id``'s queue, from its batches).

    Waits for a reconciler pass in progress (the lock), so no planned batch is published twice.
    Commits before it publishes, as a pass does (``reconcile_once``): published inside the
    transaction, a message could reach a worker whose claim then waited on the rows this
    transaction had locked, holding one of its few ledger connections (issue 36). Raises the
    broker's error; the batches it marked and could not publish (or all of them, should the
    process die between the commit and the publish) are ``queued`` with no message waiting,
    and the next reconciler pass after their grace period publishes them as lost.
    """
    marked = mark_top_ups(sessions, app, window=window, run_id=run_id)
    for queue, rows in marked.items():
        _publish(app, rows, queue=queue)
    return sum(len(rows) for rows in marked.values())


def mark_top_ups(sessions: sessionmaker[Session], app: Celery, *, window: int,
                 run_id: int | None = None) -> dict[str, list]:
    """``top_up``'s transaction: the planned batches that fill each window, ``queued`` and committed, by queue.

    Nothing is published here: the caller publishes the rows once this has returned.
    """
    marked: dict[str, list] = {}
    with sessions.begin() as s, broker_client(app) as client:
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": RECONCILER_LOCK})
        for (queue,) in s.execute(_ACTIVE_QUEUES, {"run": run_id}).all():
            if rows := _mark_top_up(s, client, queue, window=window, run_id=run_id):
                marked[queue] = rows
    return marked


def _mark_lost(session: Session, client, queue: str, *, grace_s: float) -> list:
    """Queued batches of ``queue`` past the grace period with no message waiting: marked for a new one.

    Reads the oldest queued batches and the head of the queue only (ledger/broker.py
    ``missing_messages``): a pass costs the same with 17,000 messages waiting as with 100.
    Returns their rows; the caller publishes them, at the front, once the pass has committed.
    """
    due = session.execute(_DUE, {"grace": grace_s}).scalar_one()
    oldest = session.execute(_OLDEST_QUEUED, {"queue": queue, "n": 1}).first()
    if oldest is None or oldest.enqueued_at >= due:
        return []  # the oldest is within its grace period: nothing to look for on Redis
    rows = session.execute(_OLDEST_QUEUED, {"queue": queue, "n": REPUBLISH_PER_PASS}).all()

    def enqueued_at(ids: list[int]) -> dict[int, object]:
        return dict(session.execute(_ENQUEUED_AT, {"ids": ids}).all()) if ids else {}

    by_id = {r.id: r for r in rows}
    missing, undecided = missing_messages([Queued(r.id, r.enqueued_at) for r in rows], due, client, queue,
                                          enqueued_at)
    if undecided:
        log.info("reconciler: %d queued batches of queue %s are not at its head and no later message was "
                 "seen there: looked for again next pass", undecided, queue)
    if not missing:
        return []
    still = delivery_counts.mark_message_lost(session, [b.id for b in missing])
    lost = [by_id[b.id] for b in missing if b.id in still]
    log.warning("reconciler: %d queued batches of queue %s had no message waiting and none claimed %.0f s after "
                "their last one (lost, or held by a consumer that is gone): published again, first in line "
                "(batch ids %s%s)", len(lost), queue, grace_s, [r.id for r in lost[:10]],
                "..." if len(lost) > 10 else "")
    return lost


def _mark_top_up(session: Session, client, queue: str, *, window: int, pending: int = 0,
                 run_id: int | None = None) -> list:
    """Planned batches of ``queue`` (of ``run_id`` only, if given) that fill its window, moved to ``queued``:
    their rows, for the caller to publish once the transaction has committed.

    ``pending``: messages of ``queue`` this pass will publish before these (expired leases, lost
    messages), not on the queue yet: they take their room in the window too.
    """
    room = window - ready_length(client, queue) - pending
    if room <= 0:
        return []
    rows = session.execute(_PLANNED, {"queue": queue, "n": room, "run": run_id}).all()
    if not rows:
        return []
    moved = transitions.mark_published(session, [r.id for r in rows])
    return [r for r in rows if r.id in moved]


def _take_pass(session: Session, *, min_interval_s: float, worker: str | None) -> bool:
    if not session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": RECONCILER_LOCK}).scalar():
        return False
    return session.execute(_TAKE_PASS, {"by": worker, "interval": min_interval_s}).first() is not None


def reconcile_once(sessions: sessionmaker[Session], app: Celery, *, lease_s: float, max_attempts: int,
                   grace_s: float = QUEUED_GRACE_S, window: int = DEFAULT_QUEUE_WINDOW,
                   min_interval_s: float = 0.0, worker: str | None = None,
                   may_expire: Callable[[], bool] | None = None) -> RequeueReport | None:
    """One automatic pass (workers offer one every ``--reconcile-s``).

    None if another pass holds the lock, or one ran less than ``min_interval_s`` ago.
    ``may_expire``: asked once the pass's transaction has begun; False: the pass expires no
    lease (a worker whose heartbeats have not landed steadily for a lease: the ledger may just
    be back from a stall, worker/process/heartbeat.py), and does the rest.
    Broker errors are logged, not raised: what could not be published is found again
    by a later pass (its batches are queued, and once past their grace period with no
    message waiting they are republished as lost). The pass commits before it publishes,
    so no claim ever waits on its row locks.
    """
    report = RequeueReport()
    # What the pass decides, it commits first and publishes after (issue 36): published inside its
    # transaction, a message could reach a worker whose claim then waited on the pass's row locks,
    # holding one of its few ledger connections, until the pass committed. A publish that fails
    # after the commit loses nothing: its batches are queued with no message waiting, and the
    # next pass after their grace period finds them missing and publishes them again.
    front: list = []        # expired leases, then lost messages: first in line
    top_ups: dict[str, list] = {}
    with sessions.begin() as s:
        if not _take_pass(s, min_interval_s=min_interval_s, worker=worker):
            return None
        queues = [q for (q,) in s.execute(_ACTIVE_QUEUES, {"run": None}).all()]
        try:
            with broker_client(app) as client:
                # The hand-back records are read from the broker first: a pass that cannot read them
                # expires nothing (the broker error below) rather than count a hand-back's failure.
                # Asked now, not before the pass: a pass that waited through a stall asks after it.
                expire = may_expire is None or may_expire()
                expired = (handbacks.expire_leases(s, client, lease_s=lease_s, max_attempts=max_attempts)
                           if expire else [])
                report.count_expired(expired)
                if requeued := [r.id for r in expired if r.status == "queued"]:
                    # Their messages sit in a dead consumer's unacked entries: new ones, first in line.
                    front += s.execute(_BY_ID, {"ids": requeued}).all()
                for queue in queues:
                    lost = _mark_lost(s, client, queue, grace_s=grace_s)
                    report.lost += len(lost)
                    front += lost
                    top_ups[queue] = _mark_top_up(s, client, queue, window=window,
                                                  pending=sum(1 for r in front if r.queue == queue))
        except _BROKER_ERRORS as e:
            log.warning("reconciler: the broker failed during the pass (%s: %s); the next pass retries",
                        type(e).__name__, e)
        # A commit checks its run's finish after its COMMIT (migration 0011): a worker that died in
        # between, or a run whose last open batch died here, is finished by the pass.
        active = s.execute(text("SELECT id FROM runs WHERE status = 'active' ORDER BY id")).scalars().all()
        if finished := [r for r in active if transitions.finish_run_if_drained(s, r)]:
            log.info("reconciler: runs %s finished (no batch left planned, queued or running)", finished)
    try:
        _publish_by_queue(app, front, front=True)
        report.republished = len(front)
        for queue, rows in top_ups.items():
            if rows:
                _publish(app, rows, queue=queue)
                report.topped_up += len(rows)
    except _BROKER_ERRORS as e:
        log.warning("reconciler: publishing the pass's messages failed (%s: %s); their batches are queued and "
                    "are published again once their grace period (%.0f s) has passed", type(e).__name__, e, grace_s)
    if report.expired or report.republished:
        log.warning("reconciler: %d leases expired (%d now dead, %d hand-backs with no failure counted), %d batches "
                    "republished (%d with a lost message), %d planned batches published", report.expired,
                    report.dead, report.handed_back, report.republished, report.lost, report.topped_up)
    elif report.topped_up:
        log.info("reconciler: %d planned batches published to fill the window", report.topped_up)
    return report


def requeue(sessions: sessionmaker[Session], app: Celery, *, run: str | None, lease_s: float,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, window: int = DEFAULT_QUEUE_WINDOW) -> RequeueReport:
    """``regen requeue`` (after a Redis loss) and ``regen resume``: a message for every queued batch now.

    Expires lost leases, publishes every queued batch of an active run whose id is not
    waiting on its queue (all of them after a flush; a healthy queue is not doubled),
    then fills the window from the planned batches. Planned batches beyond the window
    stay planned: the workers' reconciler publishes them as the queue drains.
    """
    report = RequeueReport()
    with sessions.begin() as s, broker_client(app) as client:
        report.expired, report.dead, report.handed_back = expire_leases(s, client, lease_s=lease_s,
                                                                        max_attempts=max_attempts, run=run)
    runs: set[str] = set()
    waiting: dict[str, set[int] | None] = {}
    after = 0
    with broker_client(app) as client:
        while True:
            with sessions.begin() as s:
                rows = s.execute(_QUEUED_AFTER, {"run": run, "after": after, "n": REQUEUE_CHUNK}).all()
                if not rows:
                    break
                after = rows[-1].id
                for q in {r.queue for r in rows} - set(waiting):
                    waiting[q] = ready_batch_ids(client, q, limit=SCAN_WINDOWS * window)
                send = [r for r in rows if not (waiting[r.queue] and r.id in waiting[r.queue])]
                transitions.mark_republished(s, [r.id for r in send])
            # After the COMMIT, as every publish (module docstring): a worker that takes the message at once
            # must find the row as the message says, and no claim waits on this transaction's row locks.
            _publish_by_queue(app, send, front=False)
            report.republished += len(send)
            runs |= {r.name for r in rows}
    run_id = None
    if run is not None:
        with sessions() as s:
            run_id = s.execute(text("SELECT id FROM runs WHERE name = :n"), {"n": run}).scalar()
    if run is None or run_id is not None:
        report.topped_up = top_up(sessions, app, window=window, run_id=run_id)
    report.runs = sorted(runs)
    return report
