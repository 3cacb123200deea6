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

from ledger.dispatch import BatchMessage
from ledger.errors import RegenError, StoreError
from ledger.objects import sha256_hex
from ledger.quality import Thresholds, classify_sample, enforce_gate
from ledger.shards import InputSlice, decode_shard, encode_shard, output_shard_url, read_input_shard
from worker.batches.ledger_calls import ClaimOutcome, claim_batch, commit_batch, fail_batch, release_batch
from worker.conversation.generation import generate_batch
from worker.engine.admission import HandedBack
from worker.engine.host import EngineDead
from worker.measure import ledger_timing
from worker.process.runtime import WorkerRuntime, WrongModel

log = logging.getLogger(__name__)

#: How often a waiting task thread looks at the shutdown flag and its lease.
POLL_S = 0.5


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
    claim = claim_batch(rt.sessions, msg.batch_id, worker=rt.options.name, lease_s=rt.options.lease_s)
    if claim.outcome is not ClaimOutcome.CLAIMED:
        # done/dead: nothing to do. Held elsewhere: a duplicate delivery. Paused run:
        # the batch stays queued in the ledger and `regen resume` publishes it again.
        log.info("batch %s (seq %s): %s, acknowledging without generating", msg.batch_id, msg.seq,
                 claim.outcome.value)
        return Outcome(claim.outcome.value, msg.batch_id)
    attempt, run, where = claim.attempt, claim.run, claim.input
    assert run is not None and where is not None
    rt.hold(msg.batch_id, attempt)
    log.info("batch %s (run %s, seq %s) attempt %s started", msg.batch_id, run["name"], msg.seq, attempt)
    try:
        return _generate_upload_commit(rt, msg, run, attempt, where)
    except _Preempted:
        release_batch(rt.sessions, msg.batch_id, attempt, reason="handed back at worker shutdown")
        raise Requeue("worker is shutting down") from None
    except _Fenced:
        return Outcome("fenced", msg.batch_id, attempt, "a newer attempt owns the batch")
    except HandedBack as e:
        # Withdrawn before any of its conversations started (worker/batches/holding.py: this worker
        # held more than its share of a run's end while others starve). Nothing was generated:
        # queued again with no failure counted, and its message goes back on the queue, where
        # this worker, its prefetch already lowered, does not take it.
        release_batch(rt.sessions, msg.batch_id, attempt, reason=f"handed back before it started: {e}")
        log.info("batch %s attempt %s handed back before it started (held beyond this worker's share)",
                 msg.batch_id, attempt)
        raise Requeue("handed back before it started") from e
    except WrongModel as e:
        release_batch(rt.sessions, msg.batch_id, attempt, reason=str(e))
        time.sleep(5)  # do not spin on a message this worker can never run
        raise Requeue(str(e)) from e
    except EngineDead as e:
        # Every batch in flight sees the death; only the first is charged a failure
        # (a batch that kills the engine every time still dies after max attempts),
        # the others are handed back untouched.
        if rt.first_to_see_engine_death():
            _record_failure(rt, msg, attempt, f"engine died: {e}")
            rt.request_exit("the engine died")
        else:
            release_batch(rt.sessions, msg.batch_id, attempt, reason="handed back: the engine died")
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
        rt.drop(msg.batch_id)


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


def _wait(rt: WorkerRuntime, batch_id: int, future: concurrent.futures.Future):
    engine = rt.engine
    while True:
        try:
            return future.result(timeout=POLL_S)
        except concurrent.futures.TimeoutError:
            pass
        if rt.shutting_down.is_set():
            future.cancel()
            raise _Preempted()
        if rt.is_lost(batch_id):
            future.cancel()
            raise _Fenced()
        if engine is not None and not engine.alive:
            future.cancel()
            raise EngineDead("engine is no longer running")


def _generate_upload_commit(rt: WorkerRuntime, msg: BatchMessage, run: dict, attempt: int,
                            where: InputSlice) -> Outcome:
    out_url = output_shard_url(run["output_url"], msg.seq)
    provenance = None
    existing = rt.store.head(out_url)
    if existing is not None:
        # An earlier attempt uploaded but never committed (crash, Postgres outage):
        # record that shard instead of generating again.
        data = rt.store.get(out_url)
        rows = list(decode_shard(data))
        _classify(rows, run, annotate=False)
        log.info("batch %s: output already in the store, committing it", msg.batch_id)
    else:
        # The ledger's record of the input (its range in a packed object), not the message's key alone.
        samples = list(decode_shard(read_input_shard(rt.store, where)))
        rt.batch_size = len(samples) or rt.batch_size  # how many batches fill the gate (worker/batches/holding.py)
        engine, renderer = rt.engine_for(run["model"])
        run_ctx = {**run, "provenance": {**run["provenance"], "engine": engine.engine_version,
                                         "chat_template_sha256": renderer.template_hash,
                                         "config_hash": run["config_hash"]}}
        provenance = {k: run_ctx["provenance"][k] for k in ("engine", "chat_template_sha256")}
        future = engine.submit(generate_batch(engine, renderer, samples, run_ctx))
        rows = _wait(rt, msg.batch_id, future)
        if rt.is_lost(msg.batch_id):
            raise _Fenced()
        _classify(rows, run, annotate=True)
        data = encode_shard(rows)
        put = rt.store.put_if_absent(out_url, data)
        if not put.created:
            # A twin attempt wrote first; the ledger must describe the bytes in the store.
            data = rt.store.get(out_url)
            rows = list(decode_shard(data))
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
