"""bench/farm.py's ledger-only mode: the real ledger functions at a farm's rates, no S3, no engine.

Threads call, through PgBouncer, what a farm's workers call: ``claim_batch`` at the farm's batch
rate, ``commit_batch`` (64 sample rows, set-based) ``hold_s`` later, then ``enforce_gate``;
``reconcile_once`` offered by every GPU process every 10 s; and (farm_workers.PlayedHeartbeats)
every process's heartbeat. Each call is paced from a clock, not from the previous one's end, so a
slow ledger shows as latency and as a rate short of its target, as it would on a farm.
The run is written straight into the ledger (its input shards are never read here).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import text

from bench.farm_services import Farm
from ledger import transitions
from ledger.db import make_engine, make_sessionmaker
from ledger.dispatch import make_celery
from ledger.quality import enforce_gate
from ledger.reconcile import reconcile_once
from ledger.states import BatchStatus
from worker.batches.ledger_calls import ClaimOutcome, claim_batch, commit_batch
from worker.measure import ledger_timing

SAMPLES_PER_BATCH = 64
#: Seconds a claimed batch is held before its commit: well inside the 30 s lease (no heartbeat here).
HOLD_S = 10.0
RECONCILE_S = 10.0
LEASE_S = 30.0


def _row(sample_id: str, j: int) -> dict:
    return {"sample_id": sample_id, "status": "done", "finish_reason": "stop", "stop_reason": None, "turns": 1,
            "tool_calls": 0, "quality": "ok",
            "usage": {"prompt_tokens": 3, "completion_tokens": 20, "reasoning_tokens": 0, "answer_tokens": 20},
            "error": None}


def write_run(farm: Farm, name: str, samples: int) -> tuple[int, list[int]]:
    """A run of ``samples`` pending samples in queued batches of 64; (run id, batch ids in order)."""
    engine = make_engine(farm.scratch.settings)
    sessions = make_sessionmaker(engine)
    n_batches = -(-samples // SAMPLES_PER_BATCH)
    with sessions.begin() as s:
        run = s.execute(text(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
            "VALUES (:n, 'bench/no-model', '{}', 'h', 's3://b/ledger-only', :q, 64, 'active') RETURNING id"),
            {"n": name, "q": f"{name}-queue"}).scalar_one()
        ids = transitions.insert_batches(s, run, [(i + 1, f"k{i}", SAMPLES_PER_BATCH) for i in range(n_batches)],
                                         status=BatchStatus.QUEUED)
        transitions.copy_pending_samples(s, run, ((f"{name}-{b}-{j}", bid, "f", j) for b, bid in enumerate(ids)
                                                   for j in range(SAMPLES_PER_BATCH)))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE batches, samples"))
    engine.dispose()
    return run, ids


@dataclass
class LedgerLoad:
    claims: int = 0
    commits: int = 0
    offers: int = 0
    passes: int = 0
    errors: int = 0


def _paced(rate: float, stop: threading.Event, pool: ThreadPoolExecutor, job) -> None:
    start = time.monotonic()
    k = 0
    while not stop.is_set():
        delay = start + k / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        pool.submit(job, k)
        k += 1


def play(farm: Farm, run_id: int, batch_ids: list[int], name: str, *, gpus: int, seconds: float,
         commits_s: float, threads: int = 48) -> LedgerLoad:
    """``gpus`` processes' claims, commits, gates and reconciler offers for ``seconds``.

    Commits start ``HOLD_S`` after the claims: read the rates from then on (farm.py does).
    """
    engine = make_engine(farm.settings, pool_size=threads, max_overflow=0, pool_timeout=120)
    sessions = make_sessionmaker(engine)
    app = make_celery(farm.settings)
    load = LedgerLoad()
    stop = threading.Event()
    lock = threading.Lock()

    def count(field: str) -> None:
        with lock:
            setattr(load, field, getattr(load, field) + 1)

    due: queue.Queue = queue.Queue()

    def claim(k: int) -> None:
        if k >= len(batch_ids):
            return
        try:
            got = claim_batch(sessions, batch_ids[k], worker=f"ledger{k % gpus}@farm", lease_s=LEASE_S)
            assert got.outcome is ClaimOutcome.CLAIMED, (batch_ids[k], got.outcome)
            count("claims")
            # The hold stands for the engine's time: claims are paced, so commits come due in order.
            due.put((time.monotonic() + HOLD_S, k, got.attempt))
        except Exception:  # noqa: BLE001 - counted and printed; the load goes on
            count("errors")

    def commit(item: tuple[float, int, int]) -> None:
        _, k, attempt = item
        try:
            rows = [_row(f"{name}-{k}-{j}", j) for j in range(SAMPLES_PER_BATCH)]
            assert commit_batch(sessions, run_id=run_id, batch_id=batch_ids[k], attempt=attempt,
                                output_key=f"s3://b/ledger-only/{k}", output_sha256="0" * 64, rows=rows)
            count("commits")
            ledger_timing.call(lambda d: "gate" if d is None else "gate_pass", enforce_gate, sessions, run_id)
        except Exception:  # noqa: BLE001
            count("errors")

    def commits_when_due() -> None:
        while not stop.is_set():
            try:
                item = due.get(timeout=0.5)
            except queue.Empty:
                continue
            delay = item[0] - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            work.submit(commit, item)

    def offer(k: int) -> None:
        try:
            report = ledger_timing.call(lambda r: "reconcile_offer" if r is None else "reconcile_pass",
                                        reconcile_once, sessions, app, lease_s=LEASE_S, max_attempts=3,
                                        window=farm.settings.queue_window, min_interval_s=0.8 * RECONCILE_S,
                                        worker=f"ledger{k % gpus}@farm")
            count("offers" if report is None else "passes")
        except Exception:  # noqa: BLE001
            count("errors")

    work = ThreadPoolExecutor(threads)
    offers = ThreadPoolExecutor(8)
    pacers = [threading.Thread(target=_paced, args=(commits_s, stop, work, claim), daemon=True),
              threading.Thread(target=commits_when_due, daemon=True),
              threading.Thread(target=_paced, args=(gpus / RECONCILE_S, stop, offers, offer), daemon=True)]
    for p in pacers:
        p.start()
    time.sleep(seconds)
    stop.set()
    for p in pacers:
        p.join()
    work.shutdown(wait=True)
    offers.shutdown(wait=True)
    engine.dispose()
    return load


def burst(farm: Farm, run_id: int, batch_ids: list[int], name: str, *, first: int, seconds: float,
          threads: int = 32) -> float:
    """Commits/s of ``threads`` threads claiming and committing one run's batches from ``first`` on, back to back."""
    engine = make_engine(farm.settings, pool_size=threads, max_overflow=0, pool_timeout=120)
    sessions = make_sessionmaker(engine)
    lock = threading.Lock()
    todo = iter(enumerate(batch_ids[first:], start=first))
    done = [0]
    deadline = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < deadline:
            with lock:
                k, batch = next(todo, (None, None))
            if batch is None:
                return
            got = claim_batch(sessions, batch, worker="burst@farm", lease_s=LEASE_S)
            rows = [_row(f"{name}-{k}-{j}", j) for j in range(SAMPLES_PER_BATCH)]
            if got.outcome is ClaimOutcome.CLAIMED and commit_batch(
                    sessions, run_id=run_id, batch_id=batch, attempt=got.attempt, output_key=f"s3://b/burst/{k}",
                    output_sha256="0" * 64, rows=rows):
                with lock:
                    done[0] += 1

    start = time.monotonic()
    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - start
    engine.dispose()
    return done[0] / elapsed
