"""bench/farm.py's ledger-only mode: the real ledger functions at a farm's rates, no S3, no engine.

Threads call, through PgBouncer, what a farm's workers call: ``claim_batch`` at the farm's batch
rate, ``commit_batch`` (64 sample rows, set-based) ``hold_s`` later, then ``enforce_gate``;
``reconcile_once`` offered by every GPU process every 10 s; and (farm_workers.PlayedHeartbeats)
every process's heartbeat. Each call is paced from a clock, not from the previous one's end, so a
slow ledger shows as latency and as a rate short of its target, as it would on a farm.

The run is written straight into the ledger (its input shards are never read here) as
``regen submit`` leaves one: every batch ``planned``, the queue's window of them published to the
bench's Redis (the reconciler's own top-up, ``ledger.reconcile.top_up``), and each claim takes
the next message off the head of the queue, as a worker's delivery does (the batch id from its
header; no Celery consumer, so no ``unacked`` entry). The reconciler's passes then do what they
do on a farm: top the window up and look for lost messages. (They once ran over batches
inserted ``queued`` with no message at all: after the grace period every pass republished 2,000
of them, a storm of the bench's own making in the pass's latency.)
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import redis as redis_lib
from sqlalchemy import text

from bench.farm_services import Farm
from ledger import transitions
from ledger.broker import BATCH_HEADER
from ledger.db import make_engine, make_sessionmaker
from ledger.dispatch import make_celery
from ledger.quality import enforce_gate
from ledger.reconcile import reconcile_once, top_up
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


def queue_of(name: str) -> str:
    return f"{name}-queue"


def write_run(farm: Farm, name: str, samples: int) -> tuple[int, list[int]]:
    """A run of ``samples`` pending samples in planned batches of 64, the first window of them published
    (as ``regen submit`` leaves a run); (run id, batch ids in order)."""
    engine = make_engine(farm.scratch.settings)
    sessions = make_sessionmaker(engine)
    n_batches = -(-samples // SAMPLES_PER_BATCH)
    with sessions.begin() as s:
        run = s.execute(text(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
            "VALUES (:n, 'bench/no-model', '{}', 'h', 's3://b/ledger-only', :q, 64, 'active') RETURNING id"),
            {"n": name, "q": queue_of(name)}).scalar_one()
        ids = transitions.insert_batches(s, run, [(i + 1, f"k{i}", SAMPLES_PER_BATCH) for i in range(n_batches)],
                                         status=BatchStatus.PLANNED)
        transitions.copy_pending_samples(s, run, ((f"{name}-{b}-{j}", bid, "f", j) for b, bid in enumerate(ids)
                                                   for j in range(SAMPLES_PER_BATCH)))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE batches, samples"))
    top_up(sessions, make_celery(farm.scratch.settings), window=farm.settings.queue_window, run_id=run)
    engine.dispose()
    return run, ids


class Deliveries:
    """The next batch off the head of a run's queue, as a worker's delivery takes it (BRPOP's end)."""

    def __init__(self, farm: Farm, name: str):
        self.client = redis_lib.Redis.from_url(farm.redis_url)
        self.queue = queue_of(name)

    def next(self) -> int | None:
        """None when the queue is empty: drained faster than the reconciler tops it up (a starved worker)."""
        raw = self.client.rpop(self.queue)
        return None if raw is None else int(json.loads(raw)["headers"][BATCH_HEADER])

    def close(self) -> None:
        self.client.close()


@dataclass
class LedgerLoad:
    claims: int = 0
    commits: int = 0
    offers: int = 0
    passes: int = 0
    #: Claims that found the queue empty (no message to take).
    empty: int = 0
    #: Calls submitted when due, calls started, and those not started when the time was up (the
    #: ledger fell behind): dropped, not run late after the window.
    due: int = 0
    started: int = 0
    not_started: int = 0
    #: Batches the reconciler's passes republished (expired leases, lost messages) and topped up.
    republished: int = 0
    topped_up: int = 0
    errors: Counter = field(default_factory=Counter)

    def words(self) -> str:
        errors = ", ".join(f"{n} {kind}" for kind, n in self.errors.most_common()) or "none"
        return (f"{self.claims:,} claims ({self.empty:,} found the queue empty), {self.commits:,} commits, "
                f"{self.passes} reconciler passes ({self.topped_up:,} batches topped up, {self.republished:,} "
                f"republished) and {self.offers:,} offers; {self.not_started:,} calls due but not started at the "
                f"end (dropped); errors: {errors}")


def _paced(rate: float, stop: threading.Event, pool: ThreadPoolExecutor, job, due) -> None:
    start = time.monotonic()
    k = 0
    while not stop.is_set():
        delay = start + k / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        due()
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
    index = {b: k for k, b in enumerate(batch_ids)}
    deliveries = Deliveries(farm, name)

    def count(field: str) -> None:
        with lock:
            setattr(load, field, getattr(load, field) + 1)

    def error(e: Exception) -> None:
        # Ours say what happened to the batch (fenced off: its lease expired and another attempt took it).
        kind = str(e).split(": ", 1)[1] if isinstance(e, RuntimeError) and ": " in str(e) else type(e).__name__
        with lock:
            load.errors[kind] += 1

    due: queue.Queue = queue.Queue()

    def claim(k: int) -> None:
        count("started")
        try:
            batch = deliveries.next()
            if batch is None:
                count("empty")
                return
            got = claim_batch(sessions, batch, worker=f"ledger{k % gpus}@farm", lease_s=LEASE_S)
            if got.outcome is not ClaimOutcome.CLAIMED:
                raise RuntimeError(f"batch {batch}: {got.outcome.value}")
            count("claims")
            # The hold stands for the engine's time: claims are paced, so commits come due in order.
            due.put((time.monotonic() + HOLD_S, batch, got.attempt))
        except Exception as e:  # noqa: BLE001 - counted and printed by kind; the load goes on
            error(e)

    def commit(item: tuple[float, int, int]) -> None:
        _, batch, attempt = item
        k = index[batch]
        count("started")
        try:
            rows = [_row(f"{name}-{k}-{j}", j) for j in range(SAMPLES_PER_BATCH)]
            if not commit_batch(sessions, run_id=run_id, batch_id=batch, attempt=attempt,
                                output_key=f"s3://b/ledger-only/{k}", output_sha256="0" * 64, rows=rows):
                raise RuntimeError(f"batch {batch}: fenced off")
            count("commits")
            ledger_timing.call(lambda d: "gate" if d is None else "gate_pass", enforce_gate, sessions, run_id)
        except Exception as e:  # noqa: BLE001
            error(e)

    def commits_when_due() -> None:
        while not stop.is_set():
            try:
                item = due.get(timeout=0.5)
            except queue.Empty:
                continue
            delay = item[0] - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            count("due")
            work.submit(commit, item)

    def offer(k: int) -> None:
        count("started")
        try:
            report = ledger_timing.call(lambda r: "reconcile_offer" if r is None else "reconcile_pass",
                                        reconcile_once, sessions, app, lease_s=LEASE_S, max_attempts=3,
                                        window=farm.settings.queue_window, min_interval_s=0.8 * RECONCILE_S,
                                        worker=f"ledger{k % gpus}@farm")
            count("offers" if report is None else "passes")
            if report is not None:
                with lock:
                    load.republished += report.republished
                    load.topped_up += report.topped_up
        except Exception as e:  # noqa: BLE001
            error(e)

    work = ThreadPoolExecutor(threads)
    offers = ThreadPoolExecutor(8)

    def due_one() -> None:
        count("due")

    pacers = [threading.Thread(target=_paced, args=(commits_s, stop, work, claim, due_one), daemon=True),
              threading.Thread(target=commits_when_due, daemon=True),
              threading.Thread(target=_paced, args=(gpus / RECONCILE_S, stop, offers, offer, due_one), daemon=True)]
    for p in pacers:
        p.start()
    time.sleep(seconds)
    stop.set()
    for p in pacers:
        p.join()
    # Calls due but not started when the time is up are dropped, not run late after it (counted).
    work.shutdown(wait=True, cancel_futures=True)
    offers.shutdown(wait=True, cancel_futures=True)
    load.not_started = load.due - load.started
    deliveries.close()
    engine.dispose()
    return load


def burst(farm: Farm, run_id: int, batch_ids: list[int], name: str, *, seconds: float,
          threads: int = 32) -> tuple[int, float]:
    """``threads`` threads taking the run's next deliveries, claiming and committing them back to back for
    ``seconds``: (commits, seconds it took)."""
    engine = make_engine(farm.settings, pool_size=threads, max_overflow=0, pool_timeout=120)
    sessions = make_sessionmaker(engine)
    index = {b: k for k, b in enumerate(batch_ids)}
    deliveries = Deliveries(farm, name)
    lock = threading.Lock()
    done = [0]
    deadline = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < deadline:
            batch = deliveries.next()
            if batch is None:
                return
            k = index[batch]
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
    deliveries.close()
    engine.dispose()
    return done[0], elapsed
