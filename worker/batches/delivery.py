"""What one delivery of a batch message does, from claim to commit.

Ack only after the output shard is uploaded, verified and committed. The task
never raises anything but a requeue: failures become ledger data (``failures``,
``error``, ``dead``) and the broker never decides that a batch is finished.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass

from ledger.db import retry_db
from ledger.dispatch import BatchMessage
from ledger.errors import RegenError, StoreError
from ledger.objects import sha256_hex
from ledger.output_check import ForeignShard, batch_sample_ids, foreign_rows_reason, refusal
from ledger.quality import Thresholds, classify_sample, enforce_gate
from ledger.shards import decode_shard, encode_shard, output_shard_url, read_input_shard
from ledger.states import refused_reason
from targets.turn_parsers import ParserUnavailable
from worker.batches.crashes import record_engine_death, take_suspects
from worker.batches.ledger_calls import (
    Claim,
    ClaimOutcome,
    claim_batch,
    commit_batch,
    fail_batch,
    release_batch,
)
from worker.conversation.generation import generate_batch
from worker.engine.admission import HandedBack
from worker.engine.host import EngineDead
from worker.engine.isolation import Flight
from worker.measure import ledger_timing
from worker.process.runtime import EngineUnavailable, NotBenchmark, WorkerRuntime, WrongModel

log = logging.getLogger(__name__)

#: How often a waiting task thread looks at the shutdown flag and its lease.
POLL_S = 0.5
#: How long a task thread keeps a message it cannot run (another model's, a real run's on a fake
#: engine) before handing it back: long enough not to spin on the queue, short enough that the
#: message soon reaches a worker that can run it.
REFUSED_PAUSE_S = 5.0
#: The lease a claim judges others' by while the ledger is not steady: none is old enough to take over.
NO_TAKEOVER_LEASE_S = 10 * 365 * 24 * 3600.0


class Requeue(RegenError):
    """Put the message back on the broker (Reject(requeue=True))."""


class _Preempted(RegenError):
    pass


class _Fenced(RegenError):
    pass


@dataclass(frozen=True)
class Outcome:
    status: str
    batch_id: int
    attempt: int = 0
    detail: str = ""


def run_batch(rt: WorkerRuntime, msg: BatchMessage) -> Outcome:
    if rt.shutting_down.is_set():
        raise Requeue("worker is shutting down")
    if rt.stop_taking.is_set():
        # Delivered as its consumer was being cancelled (worker/process/deadline.py): not claimed,
        # so another worker takes it with no attempt counted.
        raise Requeue("this worker's job ends soon: taking no new batch")
    if (wait_s := rt.hand_backs.handed_back_recently(msg.batch_id)) > 0:
        # This worker handed it back less than a probe period ago, for workers below their share:
        # back to the broker unclaimed (no attempt, no release), for one of them. The short wait
        # keeps a worker that is alone on the queue from spinning on it.
        rt.shutting_down.wait(min(wait_s, POLL_S))
        raise Requeue("handed back by this worker within the last probe period")
    fake = bool(rt.options.fake_engine)
    # An expired lease is taken over only while this process's heartbeats show the ledger steady
    # for a lease (worker/process/heartbeat.py): just back from a stall, every lease looks expired.
    lease_s = rt.options.lease_s if rt.heartbeat.ledger_steady() else NO_TAKEOVER_LEASE_S
    claim = claim_batch(rt.sessions, msg.batch_id, worker=rt.options.name, lease_s=lease_s, fake=fake)
    if claim.outcome is ClaimOutcome.NOT_BENCHMARK:
        # A fake engine makes random token ids: it serves runs submitted with --benchmark only. Nothing
        # was claimed (no attempt, no failure); the message goes back for a real worker.
        refused = rt.count_fake_refusal()
        log.error("FAKE ENGINE refuses batch %s (run %s, seq %s): the run was not submitted with --benchmark, and a "
                  "fake engine never serves a real run (%d refused by this worker); stop this worker, or submit a "
                  "benchmark run", msg.batch_id, claim.run["name"] if claim.run else "?", msg.seq, refused)
        time.sleep(REFUSED_PAUSE_S)
        raise Requeue("a fake engine serves benchmark runs only")
    if claim.outcome is ClaimOutcome.CLAIMED and not rt.held.hold(msg.batch_id, claim.attempt):
        # Another thread of this process runs this very attempt (a duplicate delivery whose claim
        # was resolved as ours after an unanswered COMMIT): that thread owns it.
        log.info("batch %s (seq %s): attempt %s already runs in this process, acknowledging the duplicate",
                 msg.batch_id, msg.seq, claim.attempt)
        return Outcome(ClaimOutcome.HELD_ELSEWHERE.value, msg.batch_id)
    if claim.outcome is not ClaimOutcome.CLAIMED:
        # done/dead: nothing to do. Held elsewhere: a duplicate delivery. Paused run:
        # the batch stays queued in the ledger and `regen resume` publishes it again.
        log.info("batch %s (seq %s): %s, acknowledging without generating", msg.batch_id, msg.seq,
                 claim.outcome.value)
        return Outcome(claim.outcome.value, msg.batch_id)
    attempt, run = claim.attempt, claim.run
    assert run is not None
    log.info("batch %s (run %s, seq %s) attempt %s started", msg.batch_id, run["name"], msg.seq, attempt)
    flight = Flight()  # its conversations on the engine, should the engine die under them
    try:
        return _generate_upload_commit(rt, msg, claim, flight)
    except _Preempted:
        # Within the shutdown's hand-back time, on the heartbeat's connection (the heartbeat has
        # stopped): the reaper's SIGKILL must not find a release half done.
        _hand_back(rt, msg.batch_id, attempt, "handed back at worker shutdown", at_shutdown=True)
        raise Requeue("worker is shutting down") from None
    except _Fenced:
        return Outcome("fenced", msg.batch_id, attempt, "a newer attempt owns the batch")
    except HandedBack as e:
        # Withdrawn before any of its conversations started (worker/batches/holding.py: this worker
        # held more than its share of a run's end while others starve). Nothing was generated:
        # queued again with no failure counted, and its message goes back on the queue, where
        # this worker, its prefetch already lowered, does not take it (nor, for a probe period,
        # claims it should it come back: ``handed_back_recently``).
        _hand_back(rt, msg.batch_id, attempt, f"handed back before it started: {e}")
        rt.hand_backs.handed_back(msg.batch_id)
        log.info("batch %s attempt %s handed back before it started (held beyond this worker's share)",
                 msg.batch_id, attempt)
        raise Requeue("handed back before it started") from e
    except (WrongModel, NotBenchmark, ParserUnavailable) as e:
        # This worker cannot run the batch, whatever the batch holds: another model's, a real run
        # on a fake engine, or parsers this worker's vLLM cannot build (a version that lacks the
        # named class, or whose class refuses the model's tokenizer: vLLM 0.26's mistral parser
        # did, 0.32's does not). Handed back with no failure counted, so on a mixed fleet a worker
        # that can run it does; counting failures would let the workers that cannot kill batches
        # the others could finish. A run that no worker can serve waits rather than dies: each
        # refusal is logged as an error here and left on its batch, and `regen status` counts them.
        log.error("batch %s (run %s, seq %s) refused: %s", msg.batch_id, run["name"], msg.seq, e)
        _hand_back(rt, msg.batch_id, attempt, refused_reason(rt.options.name, str(e)))
        time.sleep(REFUSED_PAUSE_S)  # do not spin on a message this worker can never run
        raise Requeue(str(e)) from e
    except EngineUnavailable as e:
        # This worker could not build its engine (its engine args, its node, its copy of the model): its
        # fault, not the batch's. Handed back with no failure counted, then the process exits and its
        # launcher restarts it with a growing back-off, giving up after a few quick exits: a misconfigured
        # node must not spend the attempts of every batch it takes. `regen status` shows the refusals.
        log.error("batch %s (run %s, seq %s) refused: %s", msg.batch_id, run["name"], msg.seq, e)
        _hand_back(rt, msg.batch_id, attempt, refused_reason(rt.options.name, str(e)))
        rt.request_exit(str(e))
        raise Requeue(str(e)) from e
    except EngineDead as e:
        # Every batch in flight sees the death, and none is charged for it (issue 58): each records
        # its conversations in flight as suspects and is handed back. A suspect runs isolated next
        # time, and one isolated at two deaths is failed alone as engine_crash (ledger/crash_suspects.py).
        record_engine_death(rt.sessions, msg.batch_id, flight, worker=rt.options.name)
        _hand_back(rt, msg.batch_id, attempt, f"handed back: the engine died ({e})")
        if rt.first_to_see_engine_death():
            rt.request_exit("the engine died")
        raise Requeue("engine died") from e
    except StoreError as e:
        status = _record_failure(rt, msg, attempt, f"object store ({'transient' if e.transient else 'permanent'}"
                                                   f" {e.code}): {e}")
        if status == "dead":
            return Outcome("dead", msg.batch_id, attempt, str(e))
        raise Requeue(str(e)) from e
    except Requeue:
        raise
    except Exception as e:  # noqa: BLE001 - any other failure is recorded, never lost with an ack
        log.exception("batch %s attempt %s failed", msg.batch_id, attempt)
        status = _record_failure(rt, msg, attempt, f"{type(e).__name__}: {e}")
        if status == "dead":
            return Outcome("dead", msg.batch_id, attempt, str(e))
        raise Requeue(str(e)) from e
    finally:
        rt.held.drop(msg.batch_id, attempt)


def _hand_back(rt: WorkerRuntime, batch_id: int, attempt: int, reason: str, *, at_shutdown: bool = False) -> None:
    """Release the batch, no failure counted; if the release gives up, the heartbeat retries it (issue 36).

    Whatever happens here, the caller then requeues the message: a hand-back is never
    acknowledged as if it were done, which left the batch running under a lease nobody
    renewed, to expire later as a counted failure. A release that gives up is recorded in
    Redis (``release_later``), so that the lease's expiry, should this process stop first,
    counts no failure (ledger/handbacks.py). A shutdown's hand-back is recorded before its
    release is tried: the reaper's SIGKILL may come while the release still waits on the
    ledger, and the attempt has stopped already, whatever the release's outcome.
    """
    if at_shutdown:
        recorded = rt.hand_backs.record(batch_id, attempt)
        sessions, within_s = rt.liveness_sessions, rt.hand_back_left_s()  # what the record's call left
    else:
        sessions, within_s = rt.sessions, rt.options.release_s
        recorded = False
    try:
        released = within_s > 0 and release_batch(sessions, batch_id, attempt, reason=reason, within_s=within_s)
    except Exception:  # noqa: BLE001 - not released is the outcome; the retry below is the remedy
        log.exception("releasing batch %s attempt %s failed", batch_id, attempt)
        released = False
    if released and recorded:
        rt.hand_backs.forget(batch_id, attempt)
    if not released:
        log.warning("batch %s attempt %s: its release did not land; the heartbeat keeps its lease and retries it%s",
                    batch_id, attempt, ", then it is left to its lease" if at_shutdown else "")
        rt.hand_backs.release_later(batch_id, attempt, reason, record=not recorded)


def _record_failure(rt: WorkerRuntime, msg: BatchMessage, attempt: int, error: str) -> str:
    status = fail_batch(rt.sessions, msg.batch_id, attempt, error=error, max_attempts=rt.options.max_attempts)
    log.error("batch %s attempt %s failed (%s): %s", msg.batch_id, attempt, status.value, error)
    return status.value


def _classify(rows: list[dict], run: dict, *, annotate: bool) -> None:
    """Give every row its quality class (and, when writing the shard, each event its own)."""
    thresholds = Thresholds.from_json(run.get("quality_thresholds"))
    for row in rows:
        if not annotate and row.get("quality"):
            continue
        quality, details = classify_sample(row, thresholds)
        row["quality"] = quality
        if annotate:
            for event, detail in zip(row["events"], details, strict=False):
                event["quality"] = detail


def _wait(rt: WorkerRuntime, batch_id: int, attempt: int, future: concurrent.futures.Future):
    engine = rt.engine
    while True:
        try:
            return future.result(timeout=POLL_S)
        except concurrent.futures.TimeoutError:
            pass
        # The engine's death first: the first batch to see it stops the process, and the others
        # must still be told apart from a shutdown's hand-backs (their samples are suspects).
        if engine is not None and not engine.alive:
            future.cancel()
            raise EngineDead("engine is no longer running")
        if rt.shutting_down.is_set():
            future.cancel()
            raise _Preempted()
        if rt.held.is_lost(batch_id, attempt):
            future.cancel()
            raise _Fenced()


def _check_own_shard(rt: WorkerRuntime, batch_id: int, run: dict, rows: list[dict], out_url: str) -> None:
    """A shard this attempt did not write is committed only if its rows are this batch's: this run's, its config
    hash's, its samples' (ledger/output_check.py). Raises ForeignShard, a failure of the attempt."""
    def read() -> set[str]:
        with rt.sessions() as s:
            return batch_sample_ids(s, batch_id)

    ids = retry_db(read, what=f"read batch {batch_id}'s samples")
    reason = foreign_rows_reason(rows, run_name=run["name"], config_hash=run["config_hash"], sample_ids=ids)
    if reason is not None:
        raise ForeignShard(refusal(out_url, reason))


def _generate_upload_commit(rt: WorkerRuntime, msg: BatchMessage, claim: Claim, flight: Flight) -> Outcome:
    run, attempt, where = claim.run, claim.attempt, claim.input
    assert run is not None and where is not None
    out_url = output_shard_url(run["output_url"], msg.seq)
    provenance = None
    existing = rt.store.head(out_url)
    if existing is not None:
        # An earlier attempt uploaded but never committed (crash, Postgres outage):
        # record that shard instead of generating again.
        data = rt.store.get(out_url)
        rows = list(decode_shard(data))
        _check_own_shard(rt, msg.batch_id, run, rows, out_url)
        _classify(rows, run, annotate=False)
        log.info("batch %s: output already in the store, committing it", msg.batch_id)
    else:
        # The ledger's record of the input (its range in a packed object), not the message's key alone.
        samples = list(decode_shard(read_input_shard(rt.store, where)))
        rt.batch_size = len(samples) or rt.batch_size  # how many batches fill the gate (worker/batches/holding.py)
        engine, renderer = rt.engine_for(run["model"], benchmark=bool(run.get("benchmark")),
                                         mtp=int((run.get("sampling") or {}).get("mtp_tokens") or 0))
        run_ctx = {**run, "provenance": {**run["provenance"], "engine": engine.engine_version,
                                         "chat_template_sha256": renderer.template_hash,
                                         "config_hash": run["config_hash"]}}
        provenance = {k: run_ctx["provenance"][k] for k in ("engine", "chat_template_sha256")}
        # What the engine was built with (worker/engine/host.py's settings): the run's record of
        # regen's choices (the admission watermark) and the user's --engine-args, beside the release.
        provenance["engine_settings"] = engine.settings()
        # Its crash suspects, as its claim's own statement read them: no ledger call of their own.
        take_suspects(flight, msg.batch_id, claim.suspects)
        if not engine.alive:  # died under another batch since: this one's conversations never started
            raise EngineDead("engine is no longer running")
        future = engine.submit(generate_batch(engine, renderer, samples, run_ctx, flight))
        rows = _wait(rt, msg.batch_id, attempt, future)
        if rt.held.is_lost(msg.batch_id, attempt):
            raise _Fenced()
        _classify(rows, run, annotate=True)
        data = encode_shard(rows)
        put = rt.store.put_if_absent(out_url, data)
        if not put.created:
            # A twin attempt wrote first; the ledger must describe the bytes in the store.
            data = rt.store.get(out_url)
            rows = list(decode_shard(data))
            _check_own_shard(rt, msg.batch_id, run, rows, out_url)
            _classify(rows, run, annotate=False)
    ok = commit_batch(rt.sessions, run_id=run["id"], batch_id=msg.batch_id, attempt=attempt, output_key=out_url,
                      output_sha256=sha256_hex(data), rows=rows, provenance=provenance)
    if not ok:
        raise _Fenced()
    try:
        decision = ledger_timing.call(lambda d: "gate" if d is None else "gate_pass", enforce_gate, rt.sessions,
                                      run["id"])
        if decision is not None and decision.pause:
            log.warning("run %s paused by the quality gate: %s", run["name"], decision.reason)
    except Exception:  # noqa: BLE001 - a gate problem must never fail a committed batch
        log.exception("quality gate evaluation failed for run %s", run["name"])
    done = sum(r["status"] == "done" for r in rows)
    log.info("batch %s attempt %s committed: %d done, %d failed", msg.batch_id, attempt, done, len(rows) - done)
    return Outcome("done", msg.batch_id, attempt, f"{done}/{len(rows)} samples done")
