"""Every status write of the ledger: the transitions of ledger/states.py, carried out here only.

The worker (claim, release, fail, commit), the reconciler (expired leases, republished
batches), the quality gate (pause, resume), ``regen retry`` and ``regen submit`` call
these functions; none of them writes a ``status`` column itself.
tests/unit/test_transitions.py holds every statement below against the declared
transitions and fails on a status write anywhere else.

The SQL stays raw and each statement guards the status it leaves in its ``WHERE``:
``WHERE attempts = :attempt AND status = 'running'`` is the fence that keeps a stale
attempt from overwriting a newer one, and ``AND status = 'finished'`` is what makes
reactivating a run a no-op on an active or paused one. Functions take a Session: the
caller owns the transaction (and wraps it in ``retry_db`` where a worker must outlive
a Postgres restart).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger.crash_suspects import SUSPECTS_OF_B, Suspects, suspects_from
from ledger.models import Run
from ledger.states import BatchStatus, RunStatus, SampleStatus


@dataclass(frozen=True)
class Transition:
    """One status-writing statement: which table, from which statuses, to which.

    ``source`` is empty for an insert (a new row starts in one of ``target``).
    """

    table: str
    source: frozenset[str]
    target: frozenset[str]
    sql: str


#: Every statement of this module that writes a status (the test reads this list).
TRANSITIONS: list[Transition] = []


def _transition(table: str, source: Iterable[str], target: Iterable[str], sql: str) -> Any:
    TRANSITIONS.append(Transition(table, frozenset(source), frozenset(target), sql))
    return text(sql)


_P, _Q, _R, _D, _X = (BatchStatus.PLANNED.value, BatchStatus.QUEUED.value, BatchStatus.RUNNING.value,
                      BatchStatus.DONE.value, BatchStatus.DEAD.value)
_ACTIVE, _PAUSED, _FINISHED = RunStatus.ACTIVE.value, RunStatus.PAUSED.value, RunStatus.FINISHED.value

# --- batches --------------------------------------------------------------------------------

_INSERT_BATCHES = _transition("batches", (), (_P, _Q), """
INSERT INTO batches (run_id, seq, status, input_key, input_offset, input_length, input_sha256, n_samples,
                     attempts, failures, enqueued_at)
SELECT :run, seq, CAST(:status AS varchar), key, off, len, sha, n, 0, 0,
       CASE WHEN CAST(:status AS varchar) = 'queued' THEN now() END
FROM unnest(CAST(:seqs AS int[]), CAST(:keys AS text[]), CAST(:offs AS bigint[]), CAST(:lens AS bigint[]),
            CAST(:shas AS text[]), CAST(:ns AS int[])) AS t(seq, key, off, len, sha, n)
RETURNING id, seq""")


def insert_batches(session: Session, run_id: int, planned: Sequence[tuple[int, str, int]], *,
                   status: BatchStatus = BatchStatus.PLANNED,
                   input_ranges: Sequence[tuple[int, int, str]] | None = None) -> list[int]:
    """New batches, ``(seq, input_key, n_samples)`` each, in one statement; their ids in that order.

    ``planned`` (submit: published after the commit, as the broker's window has room) or
    ``queued`` (retry --failed: published right after its commit; ``enqueued_at`` set, so
    a publish that failed is made good by the reconciler after its grace period).
    ``input_ranges``: ``(offset, length, sha256)`` of each batch's shard in a packed
    ``input_key`` (ledger/shards.py), in the order of ``planned``; None: each key is its
    batch's own object.
    """
    if status not in (BatchStatus.PLANNED, BatchStatus.QUEUED):
        raise ValueError(f"a new batch cannot start {status.value}")
    if input_ranges is not None and len(input_ranges) != len(planned):
        raise ValueError(f"{len(input_ranges)} input ranges for {len(planned)} batches")
    ranges = input_ranges if input_ranges is not None else [(None, None, None)] * len(planned)
    rows = session.execute(_INSERT_BATCHES, {
        "run": run_id, "status": status.value, "seqs": [p[0] for p in planned], "keys": [p[1] for p in planned],
        "offs": [r[0] for r in ranges], "lens": [r[1] for r in ranges], "shas": [r[2] for r in ranges],
        "ns": [p[2] for p in planned]}).all()
    by_seq = {r.seq: r.id for r in rows}
    return [by_seq[seq] for seq, _, _ in planned]


_MARK_PUBLISHED = _transition("batches", (_P,), (_Q,), """
UPDATE batches SET status = 'queued', enqueued_at = now() WHERE id = ANY(:ids) AND status = 'planned'
RETURNING id""")


def mark_published(session: Session, batch_ids: list[int]) -> set[int]:
    """Planned batches whose messages go out in this transaction: ``planned`` → ``queued``.

    The ids it moved: the caller publishes those only, so two publishers of one planned
    batch (submit and the reconciler's top-up) never both send it.
    """
    return {r[0] for r in session.execute(_MARK_PUBLISHED, {"ids": batch_ids})}


_MARK_REPUBLISHED = _transition("batches", (_P, _Q), (_Q,), """
UPDATE batches SET status = 'queued', enqueued_at = now() WHERE id = ANY(:ids) AND status IN ('queued', 'planned')""")


def mark_republished(session: Session, batch_ids: list[int]) -> None:
    """``regen requeue``'s batches given a new message: ``queued`` again, their wait restarted."""
    session.execute(_MARK_REPUBLISHED, {"ids": batch_ids})


# Returns the batch's crash suspects too (ledger/crash_suspects.py): the attempt's, read by the claim itself.
_CLAIM = _transition("batches", (_P, _Q, _R), (_R,), f"""
UPDATE batches b SET status = 'running', attempts = b.attempts + 1, worker = :worker,
       started_at = now(), heartbeat_at = now(), finished_at = NULL, error = NULL
FROM runs r
WHERE b.id = :batch AND r.id = b.run_id AND r.status <> 'paused'
  -- A fake engine (worker/engine/fake.py) serves benchmark runs only: never a real run's batch.
  AND (r.benchmark OR NOT CAST(:fake AS boolean))
  AND (b.status IN ('planned', 'queued')
       OR (b.status = 'running' AND b.heartbeat_at < now() - make_interval(secs => :lease_s)
           AND pg_postmaster_start_time() < now() - make_interval(secs => :lease_s)))
RETURNING b.attempts, b.started_at, {SUSPECTS_OF_B} AS suspects""")


@dataclass(frozen=True)
class ClaimStamp:
    """What a claim wrote that tells it apart from any other: its attempt and its transaction's start.

    ``started_at`` is ``now()``, the claiming transaction's start to the microsecond: two
    claims of one attempt number (one of which never committed) do not share it, so a
    claimer whose COMMIT got no answer can read the row and know whether the claim is its own.
    """

    attempt: int
    started_at: Any
    #: The batch's samples in flight at engine deaths, as the claim's own statement read them.
    suspects: Suspects = field(default_factory=Suspects)


def claim_stamped(session: Session, batch_id: int, *, worker: str, lease_s: float,
                  fake: bool = False) -> ClaimStamp | None:
    """Take a batch (waiting, or running with an expired lease): the claim's stamp, or None if not taken.

    ``fake``: the claimer is a fake engine, which may take a benchmark run's batches only. The stamp
    carries the batch's crash suspects, read by the claim's statement (no round trip of their own).
    """
    row = session.execute(_CLAIM, {"batch": batch_id, "worker": worker, "lease_s": lease_s, "fake": fake}).first()
    return None if row is None else ClaimStamp(row.attempts, row.started_at, suspects_from(row.suspects))


def claim(session: Session, batch_id: int, *, worker: str, lease_s: float, fake: bool = False) -> int | None:
    """Take a batch (waiting, or running with an expired lease): the new attempt, or None if not taken.

    ``fake``: the claimer is a fake engine, which may take a benchmark run's batches only.
    """
    stamp = claim_stamped(session, batch_id, worker=worker, lease_s=lease_s, fake=fake)
    return None if stamp is None else stamp.attempt


# A read, no write: whether a claim whose COMMIT got no answer holds the batch (ledger_calls.claim_batch).
_OWN_CLAIM = text("""
SELECT 1 FROM batches WHERE id = :batch AND status = 'running' AND attempts = :attempt AND started_at = :started
  AND worker = :worker""")


def holds_claim(session: Session, batch_id: int, stamp: ClaimStamp, *, worker: str) -> bool:
    """The batch is running under exactly this claim (attempt, transaction start, worker)."""
    return session.execute(_OWN_CLAIM, {"batch": batch_id, "attempt": stamp.attempt, "started": stamp.started_at,
                                        "worker": worker}).first() is not None


_RELEASE = _transition("batches", (_R,), (_Q,), """
UPDATE batches SET status = 'queued', worker = NULL, heartbeat_at = NULL, error = :reason, enqueued_at = now()
WHERE id = :batch AND attempts = :attempt AND status = 'running'""")


def release(session: Session, batch_id: int, attempt: int, *, reason: str) -> None:
    """Give the attempt's batch back, ``queued``, without counting a failure (fenced)."""
    session.execute(_RELEASE, {"batch": batch_id, "attempt": attempt, "reason": reason})


_FAIL = _transition("batches", (_R,), (_Q, _X), """
UPDATE batches SET failures = failures + 1,
       status = CASE WHEN failures + 1 >= :max THEN 'dead' ELSE 'queued' END,
       error = :error, worker = NULL, heartbeat_at = NULL, finished_at = now(), enqueued_at = now()
WHERE id = :batch AND attempts = :attempt AND status = 'running' RETURNING status""")


def fail(session: Session, batch_id: int, attempt: int, *, error: str, max_attempts: int) -> BatchStatus | None:
    """A failed attempt: ``dead`` at ``max_attempts`` failures, else ``queued``; None if fenced off."""
    # A NUL (an exception's message may quote a template or model output) is refused by Postgres text.
    error = error[:2000].replace("\x00", "\\u0000")
    row = session.execute(_FAIL, {"batch": batch_id, "attempt": attempt, "error": error,
                                  "max": max_attempts}).first()
    return None if row is None else BatchStatus(row[0])


_DONE = _transition("batches", (_R,), (_D,), """
UPDATE batches SET status = 'done', finished_at = now(), heartbeat_at = now(),
       output_key = :key, output_sha256 = :sha, prompt_tokens = :pt, completion_tokens = :ct, error = NULL,
       fake = CAST(:fake AS boolean)
WHERE id = :batch AND attempts = :attempt AND status = 'running' RETURNING id""")


def mark_done(session: Session, batch_id: int, attempt: int, *, output_key: str, output_sha256: str,
              prompt_tokens: int, completion_tokens: int, fake: bool = False) -> bool:
    """The attempt's batch is ``done`` with its output shard; False if a newer attempt fenced it off.

    ``fake``: the shard's rows were made by a fake engine (they carry ``fake_engine``).
    """
    return session.execute(_DONE, {"batch": batch_id, "attempt": attempt, "key": output_key, "sha": output_sha256,
                                   "pt": prompt_tokens, "ct": completion_tokens, "fake": fake}).first() is not None


# A read: the leases ``expire_leases`` may expire, so that their hand-back records (ledger/handbacks.py)
# are looked up before the statement decides which of them count a failure.
_EXPIRING = text("""
SELECT b.id, b.attempts, b.worker FROM batches b JOIN runs r ON r.id = b.run_id
WHERE b.status = 'running' AND b.heartbeat_at < now() - make_interval(secs => :lease_s)
  -- A lease expires only after the ledger has been up for a whole lease: heartbeats
  -- cannot land while Postgres is down, and a restart must not condemn every batch.
  AND pg_postmaster_start_time() < now() - make_interval(secs => :lease_s)
  AND (CAST(:run AS text) IS NULL OR r.name = :run)""")


def expiring_leases(session: Session, *, lease_s: float, run: str | None = None) -> list:
    """Running batches (of the run named ``run``, if given) without a heartbeat for ``lease_s``: (id, attempts, worker)."""
    return session.execute(_EXPIRING, {"lease_s": lease_s, "run": run}).all()


# Only the leases read by _EXPIRING, each still under the attempt read (a claim that took one over
# in between is left alone), and still expired. A hand-back the worker recorded (handed_back) is
# queued with no failure counted: its worker gave the batch up and could not tell the ledger.
_EXPIRE = _transition("batches", (_R,), (_Q, _X), """
UPDATE batches b SET failures = b.failures + CASE WHEN c.handed_back THEN 0 ELSE 1 END,
       status = CASE WHEN NOT c.handed_back AND b.failures + 1 >= :max THEN 'dead' ELSE 'queued' END,
       error = CASE WHEN c.handed_back
                    THEN 'lease expired after a hand-back whose release did not reach the ledger: worker '
                         || coalesce(b.worker, '?') || ' (no failure counted)'
                    ELSE 'lease expired: worker ' || coalesce(b.worker, '?') || ' stopped heartbeating' END,
       worker = NULL, heartbeat_at = NULL, enqueued_at = now()
FROM unnest(CAST(:ids AS bigint[]), CAST(:attempts AS int[]), CAST(:handed_back AS boolean[]))
     AS c(id, attempt, handed_back)
WHERE b.id = c.id AND b.attempts = c.attempt AND b.status = 'running'
  AND b.heartbeat_at < now() - make_interval(secs => :lease_s)
  AND pg_postmaster_start_time() < now() - make_interval(secs => :lease_s)
RETURNING b.id, b.status, c.handed_back""")


def expire_leases(session: Session, leases: Sequence[tuple[int, int, bool]], *, lease_s: float,
                  max_attempts: int) -> list:
    """Expire ``leases``, ``(batch id, attempt, handed back)`` each (``expiring_leases``, then ledger/handbacks.py).

    A failed attempt each (``dead`` at ``max_attempts`` failures), except a recorded hand-back:
    ``queued``, no failure counted. Rows of ``(id, status, handed_back)``; call it through
    ledger/handbacks.py ``expire_leases``, which reads the records.
    """
    if not leases:
        return []
    return session.execute(_EXPIRE, {"ids": [x[0] for x in leases], "attempts": [x[1] for x in leases],
                                     "handed_back": [bool(x[2]) for x in leases], "lease_s": lease_s,
                                     "max": max_attempts}).all()


_REVIVE_DEAD = _transition("batches", (_X,), (_Q,), """
UPDATE batches SET status = 'queued', failures = 0, enqueued_at = now()
WHERE run_id = :run AND status = 'dead' AND NOT id = ANY(CAST(:keep AS bigint[])) RETURNING id, seq, input_key""")


def revive_dead(session: Session, run_id: int, *, keep_dead: Sequence[int] = ()) -> list:
    """``regen retry --dead``: every dead batch of the run ``queued`` with its failures reset, but ``keep_dead``'s."""
    return session.execute(_REVIVE_DEAD, {"run": run_id, "keep": list(keep_dead)}).all()


# --- samples ---------------------------------------------------------------------------------


def copy_pending_samples(session: Session, run_id: int, rows: Iterable[tuple[str, int, str, int]]) -> None:
    """New samples, ``(sample_id, batch_id, source_file, source_row)`` each, ``pending``, by COPY."""
    raw = session.connection().connection.driver_connection
    with raw.cursor() as cur, cur.copy(_COPY_SAMPLES) as copy:
        for sample_id, batch_id, source_file, source_row in rows:
            copy.write_row((run_id, sample_id, batch_id, source_file, source_row, SampleStatus.PENDING.value))


_COPY_SAMPLES = "COPY samples (run_id, sample_id, batch_id, source_file, source_row, status) FROM STDIN"
TRANSITIONS.append(Transition("samples", frozenset(), frozenset({SampleStatus.PENDING.value}), _COPY_SAMPLES))

# From pending only in practice: a failed sample is moved to a new batch before it runs again,
# and its old batch, done, is fenced off. "<> 'done'" keeps a done sample from being overwritten.
# One statement for the whole batch (issue 22): 64 UPDATEs per commit each fired the counts
# trigger of migration 0005, so a commit updated the run's hot counts rows 128 times; now once.
# The count the commit checks (worker/batches/ledger_calls.py, issue 58) comes back from this statement:
# what it wrote, and the batch's n_samples (a plain read, no lock on the batch's row: a commit takes that last).
_RECORD_SAMPLES = _transition("samples", ("pending",), ("done", "failed"), """
WITH written AS (
UPDATE samples s SET status = v.status, finish_reason = v.finish, stop_reason = v.stop, turns = v.turns,
       prompt_tokens = v.pt, completion_tokens = v.ct, reasoning_tokens = v.rt, answer_tokens = v.at,
       tool_calls = v.tc, output_key = v.key, error = v.error, quality = v.quality, updated_at = now()
FROM unnest(CAST(:runs AS int[]), CAST(:sids AS text[]), CAST(:statuses AS text[]), CAST(:finishes AS text[]),
            CAST(:stops AS text[]), CAST(:turns AS int[]), CAST(:pts AS bigint[]), CAST(:cts AS bigint[]),
            CAST(:rts AS bigint[]), CAST(:ats AS bigint[]), CAST(:tcs AS int[]), CAST(:keys AS text[]),
            CAST(:errors AS text[]), CAST(:qualities AS text[]))
     AS v(run, sid, status, finish, stop, turns, pt, ct, rt, at, tc, key, error, quality)
WHERE s.run_id = v.run AND s.sample_id = v.sid AND s.status <> 'done'
  AND (CAST(:batch AS bigint) IS NULL OR s.batch_id = CAST(:batch AS bigint))
RETURNING 1)
SELECT (SELECT count(*) FROM written) AS written,
       (SELECT n_samples FROM batches WHERE id = CAST(:batch AS bigint)) AS n_samples""")

#: record_samples' per-sample keys, in the order of the statement's arrays.
_SAMPLE_COLUMNS = (("runs", "run"), ("sids", "sid"), ("statuses", "status"), ("finishes", "finish"),
                   ("stops", "stop"), ("turns", "turns"), ("pts", "pt"), ("cts", "ct"), ("rts", "rt"),
                   ("ats", "at"), ("tcs", "tc"), ("keys", "key"), ("errors", "error"), ("qualities", "quality"))


@dataclass(frozen=True)
class RecordedSamples:
    """What ``record_samples`` wrote, beside what its batch should hold."""

    #: Samples written (done or failed).
    written: int
    #: The batch's ``n_samples``; None without a batch (or for one that does not exist).
    n_samples: int | None


def record_samples(session: Session, params: list[dict], *, batch_id: int | None = None) -> RecordedSamples:
    """A committed batch's samples, ``done`` or ``failed`` each (never a sample already done), in one statement.

    ``params``: one dict per sample with the keys of ``_SAMPLE_COLUMNS`` (``run``, ``sid``,
    ``status``, ``finish``, ``stop``, ``turns``, ``pt``, ``ct``, ``rt``, ``at``, ``tc``, ``key``,
    ``error``, ``quality``). ``batch_id``: only samples the ledger places in that batch are written
    (a commit passes its own). Returns how many samples were written and the batch's ``n_samples``,
    both from the one statement: a commit checks them against each other with no read of its own.
    """
    for p in params:
        if p["status"] not in (SampleStatus.DONE.value, SampleStatus.FAILED.value):
            raise ValueError(f"sample {p.get('sid')!r}: a committed sample is done or failed, not {p['status']!r}")
    # Even with no rows: the commit of an empty shard learns its batch's n_samples, to refuse it.
    row = session.execute(_RECORD_SAMPLES, {"batch": batch_id, **{array: [p[key] for p in params]
                                                                  for array, key in _SAMPLE_COLUMNS}}).one()
    return RecordedSamples(int(row.written), row.n_samples)


_RETRY_SAMPLES = _transition("samples", ("failed",), ("pending",), """
UPDATE samples SET status = 'pending', batch_id = :batch, error = NULL, quality = NULL, updated_at = now()
WHERE run_id = :run AND sample_id = ANY(:ids) AND status = 'failed'""")


def retry_samples(session: Session, run_id: int, batch_id: int, sample_ids: list[str]) -> None:
    """``regen retry --failed``: failed samples ``pending`` again, in a new batch."""
    session.execute(_RETRY_SAMPLES, {"batch": batch_id, "run": run_id, "ids": sample_ids})


# --- runs ------------------------------------------------------------------------------------

TRANSITIONS.append(Transition("runs", frozenset(), frozenset({_ACTIVE}), "Run(status='active') in new_run"))


def new_run(session: Session, **columns: Any) -> Run:
    """A new run row, ``active`` (flushed: its id is set)."""
    run = Run(status=RunStatus.ACTIVE.value, **columns)
    session.add(run)
    session.flush()
    return run


# Held by a transaction that adds open batches (submit, retry) to its COMMIT: the finish check locks
# the row before it looks again, so it sees those batches, or finishes first and the UPDATE below sees that.
_LOCK_RUN_FOR_NEW_WORK = text("SELECT 1 FROM runs WHERE id = :run FOR SHARE")
_REACTIVATE = _transition("runs", (_FINISHED,), (_ACTIVE,), """
UPDATE runs SET status = 'active' WHERE id = :run AND status = 'finished'""")


def reactivate_run(session: Session, run_id: int) -> None:
    """A finished run with new work (retry, resubmit) is ``active`` again. Call it last: the row is the last lock."""
    session.execute(_LOCK_RUN_FOR_NEW_WORK, {"run": run_id})
    session.execute(_REACTIVATE, {"run": run_id})


# "Drained": the run's open-batch counters (64 shards, migration 0011) sum to 0. Not an EXISTS over batches:
# for a run mostly done the planner reads the table from its start (95% done: 2,216 buffers at 100K batches).
_OPEN = "(SELECT coalesce(sum(open_batches), 0) FROM run_batch_counts WHERE run_id = :run) > 0"
_LOCK_ACTIVE_RUN = text("SELECT 1 FROM runs WHERE id = :run AND status = 'active' FOR UPDATE")
_FINISH_IF_DRAINED = _transition("runs", (_ACTIVE,), (_FINISHED,), f"""
UPDATE runs SET status = 'finished' WHERE id = :run AND status = 'active' AND NOT {_OPEN} RETURNING id""")


def finish_run_if_drained(session: Session, run_id: int) -> bool:
    """An active run with no batch left planned, queued or running is ``finished``. True if it was.

    Call it in a transaction begun after the commits that closed batches (a commit runs it after its
    own): of two commits closing the last two batches, the later check sees both. One read of the run's
    counters while batches are open; then the run's row is locked (``reactivate_run``) and looked at anew.
    """
    if session.execute(text(f"SELECT {_OPEN}"), {"run": run_id}).scalar():
        return False
    if session.execute(_LOCK_ACTIVE_RUN, {"run": run_id}).first() is None:
        return False
    return session.execute(_FINISH_IF_DRAINED, {"run": run_id}).first() is not None


_PAUSE = _transition("runs", (_ACTIVE,), (_PAUSED,), """
UPDATE runs SET status = 'paused', status_reason = :reason WHERE id = :run AND status = 'active' RETURNING id""")
# Re-checks the override: a `regen resume --force` may land between the gate's evaluation and this.
_PAUSE_UNLESS_OVERRIDDEN = _transition("runs", (_ACTIVE,), (_PAUSED,), """
UPDATE runs SET status = 'paused', status_reason = :reason WHERE id = :run AND status = 'active'
  AND coalesce((quality_thresholds ->> 'gate_overridden')::boolean, false) = false RETURNING id""")


def pause_run(session: Session, run_id: int, reason: str, *, unless_overridden: bool = False) -> bool:
    """Pause an active run with ``reason``; False if it was not active (or, if asked, the gate is overridden)."""
    statement = _PAUSE_UNLESS_OVERRIDDEN if unless_overridden else _PAUSE
    return session.execute(statement, {"run": run_id, "reason": reason[:2000]}).first() is not None


_UNPAUSE = _transition("runs", (_PAUSED,), (_ACTIVE,), """
UPDATE runs SET status = 'active', status_reason = NULL, gate_checked_at = NULL WHERE id = :run AND status = 'paused'
RETURNING id""")
_UNPAUSE_OVERRIDDEN = _transition("runs", (_PAUSED,), (_ACTIVE,), """
UPDATE runs SET status = 'active', status_reason = NULL, gate_checked_at = NULL,
       quality_thresholds = coalesce(quality_thresholds, '{}'::jsonb) || '{"gate_overridden": true}'
WHERE id = :run AND status = 'paused' RETURNING id""")


def unpause_run(session: Session, run_id: int, *, override_gate: bool) -> RunStatus | None:
    """A paused run ``active`` again, or ``finished`` if its last batches committed while it was paused.

    Call it holding the run's row lock (``SELECT ... FOR UPDATE``). ``override_gate``
    records ``gate_overridden`` so the gate does not pause the run again. None if the run was not paused.
    """
    statement = _UNPAUSE_OVERRIDDEN if override_gate else _UNPAUSE
    if session.execute(statement, {"run": run_id}).first() is None:
        return None
    return RunStatus.FINISHED if finish_run_if_drained(session, run_id) else RunStatus.ACTIVE
