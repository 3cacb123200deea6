"""The worker's side of the ledger: claim with a fencing token, heartbeat, commit, release.

``batches.attempts`` is the fencing token. A claim increments it; every later
write of that attempt says ``WHERE attempts = :attempt AND status = 'running'``.
A stale attempt (its worker was presumed dead, or the broker redelivered the
message after its visibility timeout) therefore can never overwrite a newer
record: its commit finds no row and it acknowledges without writing.

The statements themselves, fences included, are ledger/transitions.py's (the one
module that writes a status); this module adds the worker's retries and outcomes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import Enum

from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from ledger import delivery_counts, transitions
from ledger.crash_suspects import Suspects
from ledger.db import retry_db
from ledger.errors import RegenError
from ledger.runs import run_of_batch
from ledger.shards import InputSlice
from ledger.states import BatchStatus, RunStatus
from worker.measure.ledger_timing import timed
from worker.process.options import RELEASE_WITHIN_S

log = logging.getLogger(__name__)


class ClaimOutcome(str, Enum):
    CLAIMED = "claimed"
    ALREADY_DONE = "already_done"        # done or dead: ack, nothing to do
    HELD_ELSEWHERE = "held_elsewhere"    # a live attempt holds it: this delivery is a duplicate
    RUN_PAUSED = "run_paused"            # hand it back without generating
    MISSING = "missing"                  # no such batch (ledger reset): ack
    NOT_BENCHMARK = "not_benchmark"      # a fake engine was handed a real run's batch: hand it back, untouched


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    attempt: int = 0
    #: The run's ``RunRecord.for_worker()``: the dict the batch path takes.
    run: dict | None = None
    #: Where the batch's input shard is, as the ledger says (its range in a packed object).
    input: InputSlice | None = None
    #: The batch's samples in flight at engine deaths (ledger/crash_suspects.py), as the claim read them.
    suspects: Suspects = field(default_factory=Suspects)


@timed("claim")
def claim_batch(sessions: sessionmaker[Session], batch_id: int, *, worker: str, lease_s: float,
                fake: bool = False) -> Claim:
    """Claim the batch for ``worker``, retried through a ledger outage; ``fake``: the worker runs the
    fake engine (benchmark runs only).

    A COMMIT that fails on the wire is ambiguous: the server may have committed the claim
    before the connection broke. Retried blindly, the claim would find the batch running
    under a live lease (its own), count a stale delivery and acknowledge it: the batch held
    by nobody until its lease expired, and that expiry counted as a failure (issue 36). So
    the retry after such a COMMIT first reads the row for the claim's own stamp (attempt
    and transaction start, ledger/transitions.py ``ClaimStamp``): found, the claim is ours.

    A claim returns the batch's crash suspects, read by its own statement: no round trip of
    their own, and what the attempt runs with is what the ledger held when it took the batch.
    """
    pending: list[transitions.ClaimStamp] = []  # a claim whose COMMIT got no answer

    def tx() -> Claim:
        if pending:
            with sessions.begin() as s:
                found = run_of_batch(s, batch_id)
                if found is not None and transitions.holds_claim(s, batch_id, pending[0], worker=worker):
                    log.info("batch %s: the claim's COMMIT got no answer, and the row shows it took effect: "
                             "attempt %s is ours", batch_id, pending[0].attempt)
                    _, record, where = found
                    return Claim(ClaimOutcome.CLAIMED, attempt=pending[0].attempt, run=record.for_worker(),
                                 input=where, suspects=pending[0].suspects)
            pending.clear()  # it did not: claim again
        with sessions.begin() as s:
            stamp = transitions.claim_stamped(s, batch_id, worker=worker, lease_s=lease_s, fake=fake)
            claim = _claim_outcome(s, batch_id, stamp, fake=fake)
            if stamp is not None:
                pending[:] = [stamp]  # from here to the COMMIT's answer the claim may or may not be ours
        pending.clear()
        return claim

    return retry_db(tx, what=f"claim batch {batch_id}")


def _claim_outcome(s: Session, batch_id: int, stamp: transitions.ClaimStamp | None, *, fake: bool = False) -> Claim:
    found = run_of_batch(s, batch_id)
    if found is None:
        return Claim(ClaimOutcome.MISSING)
    batch_status, record, where = found
    run = record.for_worker()
    if stamp is not None:
        return Claim(ClaimOutcome.CLAIMED, attempt=stamp.attempt, run=run, input=where, suspects=stamp.suspects)
    if batch_status in (BatchStatus.DONE.value, BatchStatus.DEAD.value):
        # A stale delivery (a duplicate, or an old message back after the visibility timeout): counted.
        delivery_counts.count_stale_delivery(s, batch_id)
        return Claim(ClaimOutcome.ALREADY_DONE, run=run)
    if record.status == RunStatus.PAUSED.value:
        return Claim(ClaimOutcome.RUN_PAUSED, run=run)
    if fake and not record.benchmark and batch_status != BatchStatus.RUNNING.value:
        # Waiting for a real engine: counted (regen status, regen metrics), the message goes back.
        # A running batch's delivery is a duplicate, acknowledged below as for any worker.
        delivery_counts.count_fake_refusal(s, batch_id)
        return Claim(ClaimOutcome.NOT_BENCHMARK, run=run)
    delivery_counts.count_stale_delivery(s, batch_id)
    return Claim(ClaimOutcome.HELD_ELSEWHERE, run=run)


# The rows held that nobody else has locked, renewed; and, from the statement's snapshot, which of
# the held are still ours. A row locked by another transaction (this worker's own commit waiting
# on the run's counters, another worker's claim, the reconciler) is skipped, not waited for: one
# locked row must not hold up the renewal of the hundreds of others (issue 36). A skipped row is
# renewed by the next beat; it is lost only if the committed row says so.
_HEARTBEAT = text("""
WITH held AS (SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:attempts AS int[])) AS h(id, attempt)),
free AS (SELECT b.id FROM batches b JOIN held h ON h.id = b.id AND h.attempt = b.attempts
         WHERE b.status = 'running' ORDER BY b.id FOR UPDATE OF b SKIP LOCKED),
renewed AS (UPDATE batches b SET heartbeat_at = now() FROM free f WHERE b.id = f.id RETURNING b.id)
SELECT h.id, h.attempt FROM held h JOIN batches b ON b.id = h.id AND b.attempts = h.attempt AND b.status = 'running'""")


@timed("heartbeat")
def renew_leases(sessions: sessionmaker[Session], held: Collection[tuple[int, int]]) -> set[tuple[int, int]]:
    """Refresh the lease of every (batch, attempt) held that no one has locked; return the attempts no longer ours.

    Pairs, not a batch's one attempt: a process may hold two attempts of one batch (worker/batches/held.py).
    Run with nothing held as well: a beat that landed is the process's evidence that the ledger answers
    (worker/process/heartbeat.py ``ledger_steady``).
    """
    pairs = sorted(held)
    with sessions.begin() as s:
        ours = s.execute(_HEARTBEAT, {"ids": [b for b, _ in pairs], "attempts": [a for _, a in pairs]}).all()
    return set(pairs) - {(b, a) for b, a in ours}


def heartbeat(sessions: sessionmaker[Session], held: dict[int, int]) -> set[int]:
    """``renew_leases`` for ``{batch id: attempt}``; return the batches no longer ours."""
    return {b for b, _ in renew_leases(sessions, held.items())}


@timed("release")
def release_batch(sessions: sessionmaker[Session], batch_id: int, attempt: int, *, reason: str,
                  within_s: float = RELEASE_WITHIN_S) -> bool:
    """Give a batch back (shutdown, paused run): queued again, attempt kept as history. False if it gave up.

    Every try, its wait for a connection and its statement included, ends by ``within_s``
    (a statement timeout, set per try from what is left): a shutdown's hand-back must be
    over before the reaper's SIGKILL (worker/process/options.py ``HAND_BACK_S``). A release
    that gives up leaves the batch running under its attempt: the caller retries it later
    or leaves it to its lease, and never acknowledges its message as if it were done.
    """
    deadline = time.monotonic() + within_s

    def tx() -> None:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise _GaveUp
        with sessions.begin() as s:
            s.execute(text(f"SET LOCAL statement_timeout = {left_ms}"))
            transitions.release(s, batch_id, attempt, reason=reason)

    try:
        retry_db(tx, what=f"release batch {batch_id}", max_wait_s=within_s, base_delay_s=0.1)
    except (_GaveUp, OperationalError, PoolTimeout) as e:
        log.warning("releasing batch %s attempt %s gave up after %.0f s (%s)", batch_id, attempt, within_s,
                    type(e).__name__)
        return False
    return True


class _GaveUp(Exception):
    """A release's time ran out between two tries."""


@timed("fail")
def fail_batch(sessions: sessionmaker[Session], batch_id: int, attempt: int, *, error: str,
               max_attempts: int) -> BatchStatus:
    """Record a failed attempt: ``dead`` once failures reach ``max_attempts``, else back to ``queued``."""
    def tx() -> BatchStatus:
        with sessions.begin() as s:
            status = transitions.fail(s, batch_id, attempt, error=error, max_attempts=max_attempts)
        # Fenced off: another attempt holds the batch, which is still running as far as this one knows.
        return BatchStatus.RUNNING if status is None else status
    return retry_db(tx, what=f"fail batch {batch_id}")


class _FencedOff(Exception):
    """Raised inside a commit's transaction to roll it back: its attempt is no longer the batch's."""


class IncompleteCommit(RegenError):
    """A commit's rows did not record every sample of its batch: rolled back, never done with samples left pending."""


def _check_every_sample_recorded(batch_id: int, recorded: transitions.RecordedSamples, rows: int) -> None:
    """The rows recorded must be the batch's samples, all of them and nothing else (issue 58): a shard of
    other sample ids, or of fewer, would mark the batch done and leave its own samples pending for ever,
    and one of more would put another batch's sample in a done shard twice. ``recorded`` carries the
    batch's ``n_samples`` from the statement that wrote the samples: the check costs no statement."""
    updated, n_samples = recorded.written, recorded.n_samples
    if updated != n_samples or rows != n_samples:
        raise IncompleteCommit(f"batch {batch_id}: its {rows} rows recorded {updated} of its {n_samples} samples "
                               "(rows of other samples, or missing ones): not committed")


def _ledger_text(value: str | None) -> str | None:
    """A string from a template, parser or model, fit for a text column: Postgres refuses NUL in text, and one
    NUL made the whole batch's commit fail for ever (issue 58). Written as the escape JSON uses; the shard
    keeps the value as it was."""
    return value.replace("\x00", "\\u0000") if isinstance(value, str) else value


@timed("commit")
def commit_batch(sessions: sessionmaker[Session], *, run_id: int, batch_id: int, attempt: int, output_key: str,
                 output_sha256: str, rows: list[dict], provenance: dict | None = None) -> bool:
    """Record a finished batch and all its samples in one transaction. False if fenced off."""
    # Told from the shard's own rows, not from the engine at hand: a shard an earlier attempt
    # uploaded is committed as it is, whoever made it.
    fake = any(r.get("fake_engine") for r in rows)
    prompt_tokens = sum(r["usage"]["prompt_tokens"] for r in rows)
    completion_tokens = sum(r["usage"]["completion_tokens"] for r in rows)
    sample_params = [{
        "run": run_id, "sid": r["sample_id"], "status": r["status"], "finish": r.get("finish_reason"),
        "stop": _ledger_text(r.get("stop_reason")), "turns": r.get("turns"), "pt": r["usage"]["prompt_tokens"],
        "ct": r["usage"]["completion_tokens"], "rt": r["usage"].get("reasoning_tokens"),
        "at": r["usage"].get("answer_tokens"), "tc": r.get("tool_calls"), "key": output_key,
        "quality": r.get("quality"),
        "error": None if r.get("error") is None
        else _ledger_text(f"{r['error']['reason']}: {r['error']['detail']}"[:2000]),
    } for r in rows]

    def tx() -> bool:
        try:
            with sessions.begin() as s:
                # Samples first, the batch's own row last: a commit that waits on a counters row holds
                # no batch row meanwhile, so heartbeats renew its lease (issue 36). The counters it moves
                # are its batch's shard of the run's (migration 0011): no other commit of the run waits
                # on them unless their batch ids are equal modulo 64 (docs/ledger.md, "The commit path":
                # why a submit group beside it can no longer deadlock with it, issue 58).
                recorded = transitions.record_samples(s, sample_params, batch_id=batch_id)
                _check_every_sample_recorded(batch_id, recorded, len(rows))
                if not transitions.mark_done(s, batch_id, attempt, output_key=output_key,
                                             output_sha256=output_sha256, prompt_tokens=prompt_tokens,
                                             completion_tokens=completion_tokens, fake=fake):
                    raise _FencedOff  # a newer attempt holds the batch: roll the samples back
                if provenance:
                    # The run record names the engine and chat template its first batch used.
                    s.execute(text("UPDATE runs SET provenance = coalesce(provenance, '{}'::jsonb) || "
                                   "CAST(:prov AS jsonb) WHERE id = :run AND NOT coalesce(provenance, "
                                   "'{}'::jsonb) ? 'chat_template_sha256'"),
                              {"run": run_id, "prov": json.dumps(provenance)})
                return True
        except _FencedOff:
            return False

    def finish() -> None:
        # After the COMMIT, in a transaction of its own: of two commits that close a run's last two
        # batches, the check that runs last sees both (ledger/transitions.py). A worker that dies
        # before it leaves the run to the reconciler's next pass, which checks every active run.
        with sessions.begin() as s:
            transitions.finish_run_if_drained(s, run_id)

    if not retry_db(tx, what=f"commit batch {batch_id}"):
        return False
    try:
        retry_db(finish, what=f"finish check of run {run_id}", max_wait_s=30.0)
    except Exception as e:  # noqa: BLE001 - the batch is committed; the run's finish waits for a pass
        log.warning("batch %s committed; the finish check of run %s failed (%s: %s): the reconciler's next "
                    "pass checks it", batch_id, run_id, type(e).__name__, e)
    return True


# What is left of the active runs on some queues: open_batches is a counter kept by triggers,
# sharded by batch (run_batch_counts, migration 0011: 64 rows per run), and "any planned batch"
# stops at the first row of the partial index batches_planned_idx (migration 0007).
_BACKLOG = text("""
SELECT coalesce((SELECT sum(c.open_batches) FROM run_batch_counts c JOIN runs r ON r.id = c.run_id
                 WHERE r.status = 'active' AND r.queue = ANY(:queues)), 0) AS open_batches,
       coalesce(bool_or(EXISTS (SELECT 1 FROM batches b WHERE b.run_id = r.id AND b.status = 'planned')), false)
           AS planned
FROM runs r WHERE r.status = 'active' AND r.queue = ANY(:queues)""")


def run_backlog(sessions: sessionmaker[Session], queues: tuple[str, ...]) -> tuple[int, bool]:
    """``(open batches, any planned)`` of the active runs on ``queues``: not done or dead, and not yet published."""
    with sessions() as s:
        row = s.execute(_BACKLOG, {"queues": list(queues)}).one()
    return int(row.open_batches), bool(row.planned)
