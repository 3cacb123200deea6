"""Process-wide state of one worker process (one per GPU group).

Holds what every task thread shares: the ledger sessions, the object store, the
engine (loaded once, reused), the batches in flight with their fencing tokens,
the heartbeat thread that keeps their leases, and the shutdown flag.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time

import redis as redis_lib
from redis.exceptions import RedisError

from ledger import handbacks
from ledger.db import make_engine, make_sessionmaker
from ledger.errors import RegenError
from ledger.model_path import resolve_model
from ledger.objects import ObjectStore
from ledger.settings import Settings
from worker.batches.ledger_calls import heartbeat, release_batch
from worker.conversation.rendering import Renderer
from worker.engine.admission import ASSUMED_BATCH_SIZE
from worker.engine.host import EngineHost
from worker.measure import ledger_timing
from worker.process.options import WorkerOptions

log = logging.getLogger(__name__)

#: Ledger connections of the task threads of one worker process (claims, commits, releases, the
#: reconciler, the backlog probe): kept open, and at most this many more at a burst.
DB_POOL_SIZE, DB_MAX_OVERFLOW = 2, 1
#: The heartbeat's own connection (issue 36): one, which no task thread can take, so the leases
#: of every held batch are renewed however long commits queue for the pool above.
LIVENESS_POOL_SIZE = 1
#: What a worker process holds at most, the figure nodes and the farm's pooler are sized by
#: (docs/deploy.md, "Connections").
DB_CONNECTIONS_PER_PROCESS = DB_POOL_SIZE + DB_MAX_OVERFLOW + LIVENESS_POOL_SIZE
#: Connect and reply timeout of a hand-back record's Redis call (ledger/handbacks.py): a shutdown's
#: hand-back records before it releases, all within ``HAND_BACK_S``.
RECORD_TIMEOUT_S = 1.0


class WrongModel(RegenError):
    pass


class NotBenchmark(RegenError):
    """A fake engine (worker/engine/fake.py) was asked to serve a run not submitted with ``--benchmark``."""


class EngineUnavailable(RegenError):
    """This process could not build its engine (its engine args, its node's memory, its copy of the model).

    The worker's fault, not the batch's: a process that failed every batch it took on this would
    spend their attempts until they died, batches the rest of the farm could finish. So the batch is
    handed back with no failure counted and the process exits; its launcher restarts it with a growing
    back-off and gives up after a few quick exits (worker/process/launcher.py).
    """


class WorkerRuntime:
    def __init__(self, settings: Settings, options: WorkerOptions):
        self.settings = settings
        self.options = options
        # Threads touch the ledger briefly (claim, commit: milliseconds); dozens of held batches
        # share a few connections, and wait for one when the ledger is slow (up to pool_timeout:
        # a lease is not at stake while they wait, the heartbeat below keeps it).
        self.db = make_engine(settings, pool_size=DB_POOL_SIZE, max_overflow=DB_MAX_OVERFLOW, pool_timeout=120)
        self.sessions = make_sessionmaker(self.db)
        # The heartbeat's: nobody else checks it out while the process runs, so it never waits
        # for one (pool_timeout only bounds the shutdown's hand-backs, which borrow it once the
        # heartbeat has stopped: worker/batches/delivery.py).
        self.liveness_db = make_engine(settings, pool_size=LIVENESS_POOL_SIZE, max_overflow=0,
                                       pool_timeout=options.hand_back_s)
        self.liveness_sessions = make_sessionmaker(self.liveness_db)
        self.store = ObjectStore.from_settings(settings)
        self.shutting_down = threading.Event()
        #: Set at ``options.stop_taking_at`` (a SLURM job's end nearing): no new claim, held batches go on.
        self.stop_taking = threading.Event()
        self._engine: EngineHost | None = None
        self._renderer: Renderer | None = None
        self._engine_lock = threading.Lock()
        #: Why the engine could not be built, once it could not: later batches are refused at once, not after
        #: another load (minutes for a large model) that fails the same way.
        self._build_error: str | None = None
        self._held: dict[int, int] = {}
        self._held_peak = 0
        self._lost: set[int] = set()
        self._held_lock = threading.Lock()
        #: Hand-backs whose release gave up: (attempt, reason) by batch. The heartbeat keeps their
        #: leases and retries the release every beat, so a slow ledger costs them no failure.
        self._unreleased: dict[int, tuple[int, str]] = {}
        #: Batches this process handed back, and when (monotonic): not taken again within a probe period.
        self._handed_back: dict[int, float] = {}
        self._shutdown_at: float | None = None
        self._records_client: redis_lib.Redis | None = None
        self._hb_thread: threading.Thread | None = None
        self._engine_death_seen = False
        self._exit_requested = False
        #: Samples in the last batch read: how many batches fill the admission gate (``held_floor``).
        self.batch_size = ASSUMED_BATCH_SIZE
        #: Deliveries this process refused because it runs the fake engine and the run is not a benchmark run.
        self.fake_refusals = 0

    # -- engine ---------------------------------------------------------------------------
    def engine_for(self, model: str, *, benchmark: bool = False) -> tuple[EngineHost, Renderer]:
        """The process's engine, loaded on first use. A process serves one model.

        ``benchmark``: the batch's run was submitted with ``--benchmark``. The fake engine serves
        no other (the claim already refused them: this is the second lock on the same door).

        Raises:
            WrongModel: the process serves another model.
            NotBenchmark: a fake engine was asked for a run that is not a benchmark run.
            EngineUnavailable: the engine could not be built, now or at an earlier try.
        """
        model = resolve_model(model)
        if self.options.fake_engine and not benchmark:
            raise NotBenchmark(f"a fake engine serves benchmark runs only, not a run of {model}")
        with self._engine_lock:
            if self._engine is None and self._build_error is not None:
                raise EngineUnavailable(self._build_error)
            if self._engine is None and self.options.fake_engine:
                from worker.engine.fake import FakeEngineHost, FakeEngineSpec, FakeRenderer

                engine = FakeEngineHost(model, FakeEngineSpec.parse(self.options.fake_engine))
                self._build(engine)
                self._renderer = FakeRenderer(engine.max_model_len)  # type: ignore[assignment]
            elif self._engine is None:
                engine = EngineHost(model=model, engine_args=self.options.engine_args)
                self._build(engine)
                self._renderer = Renderer(engine.tokenizer, engine.max_model_len)
            elif self._engine.model != model:
                raise WrongModel(f"this worker serves {self._engine.model}, not {model}")
            assert self._renderer is not None
            return self._engine, self._renderer

    def _build(self, engine: EngineHost) -> None:
        """Start ``engine`` as the process's engine; a failure to build it is this worker's (EngineUnavailable)."""
        try:
            engine.start()
        except Exception as e:
            self._build_error = f"this worker could not build its engine for {engine.model}: {type(e).__name__}: {e}"
            with contextlib.suppress(Exception):  # what the failed build left running; the process exits next
                engine.shutdown()
            raise EngineUnavailable(self._build_error) from e
        self._engine = engine

    def count_fake_refusal(self) -> int:
        """One more real run's delivery refused by this fake-engine process; the total so far."""
        with self._held_lock:
            self.fake_refusals += 1
            return self.fake_refusals

    @property
    def engine(self) -> EngineHost | None:
        return self._engine

    # -- in-flight batches and their leases ---------------------------------------------------
    def hold(self, batch_id: int, attempt: int) -> bool:
        """Hold the batch's attempt; False if this process holds that attempt already (a duplicate delivery)."""
        with self._held_lock:
            if self._held.get(batch_id) == attempt:
                return False
            self._held[batch_id] = attempt
            self._lost.discard(batch_id)
            self._held_peak = max(self._held_peak, len(self._held))
            return True

    def drop(self, batch_id: int) -> None:
        with self._held_lock:
            self._held.pop(batch_id, None)
            self._lost.discard(batch_id)

    # -- hand-backs -----------------------------------------------------------------------------
    def handed_back(self, batch_id: int) -> None:
        """Remember a batch this process gave back, so that it does not take it again at once."""
        now = time.monotonic()
        with self._held_lock:
            self._handed_back = {b: t for b, t in self._handed_back.items() if now - t < self.options.heartbeat_s}
            self._handed_back[batch_id] = now

    def handed_back_recently(self, batch_id: int) -> float:
        """Seconds until this process may take ``batch_id`` again (0: now): one probe period after it handed it back.

        The probe (worker/batches/holding.py) runs once per heartbeat period: within one, the
        worker's share has not been read again, and a hand-back taken straight back is only churn
        (a claim, an attempt, a release) while the workers it was handed back for wait for it.
        """
        with self._held_lock:
            at = self._handed_back.get(batch_id)
        return 0.0 if at is None else max(0.0, at + self.options.heartbeat_s - time.monotonic())

    def release_later(self, batch_id: int, attempt: int, reason: str, *, record: bool = True) -> None:
        """A hand-back whose release gave up: the heartbeat keeps its lease and retries the release each beat.

        Recorded in Redis as well (ledger/handbacks.py; ``record`` False: the caller has), so that
        should the process stop before a retry lands, the lease's expiry counts no failure.
        """
        with self._held_lock:
            self._unreleased[batch_id] = (attempt, reason)
        if record:
            self.record_hand_back(batch_id, attempt)

    def record_hand_back(self, batch_id: int, attempt: int) -> bool:
        """Tell the reconciler, through Redis, that this attempt was handed back (ledger/handbacks.py). False: not told."""
        return self._record_hand_backs({batch_id: attempt})

    def _record_hand_backs(self, attempts: dict[int, int]) -> bool:
        try:
            handbacks.record_hand_backs(self._records(), attempts, worker=self.options.name)
            return True
        except (RedisError, OSError) as e:
            log.warning("batches %s: their hand-back could not be recorded in Redis either (%s: %s); if a release "
                        "does not land, its lease's expiry counts a failure", sorted(attempts), type(e).__name__, e)
            return False

    def forget_hand_back(self, batch_id: int, attempt: int) -> None:
        """The release landed: its record is not needed (a record left behind matches nothing, and expires)."""
        try:
            handbacks.forget_hand_back(self._records(), batch_id, attempt)
        except (RedisError, OSError) as e:
            log.debug("forgetting the hand-back record of batch %s failed: %s", batch_id, e)

    def _records(self):
        """The Redis client of the hand-back records: short timeouts, as a shutdown's hand-back is timed."""
        if self._records_client is None:
            self._records_client = redis_lib.Redis.from_url(self.settings.redis_url, socket_timeout=RECORD_TIMEOUT_S,
                                                            socket_connect_timeout=RECORD_TIMEOUT_S)
        return self._records_client

    def unreleased(self) -> dict[int, int]:
        with self._held_lock:
            return {b: a for b, (a, _) in self._unreleased.items()}

    def hand_back_left_s(self) -> float:
        """Time left for a shutdown's hand-backs (``options.hand_back_s`` from the shutdown's start)."""
        start = self._shutdown_at if self._shutdown_at is not None else time.monotonic()
        return max(0.0, start + self.options.hand_back_s - time.monotonic())

    def _retry_releases(self, within_s: float) -> None:
        with self._held_lock:
            pending = dict(self._unreleased)
        for batch_id, (attempt, reason) in pending.items():
            if not release_batch(self.liveness_sessions, batch_id, attempt, reason=reason, within_s=within_s):
                return  # the ledger is still out of reach: the rest wait for the next beat, not the heartbeat
            log.info("batch %s attempt %s released at last (%s)", batch_id, attempt, reason)
            with self._held_lock:
                self._unreleased.pop(batch_id, None)
            self.forget_hand_back(batch_id, attempt)

    def held_count(self) -> int:
        with self._held_lock:
            return len(self._held)

    def take_held_peak(self) -> int:
        """The most batches held at once since the last call (worker/batches/holding.py)."""
        with self._held_lock:
            peak, self._held_peak = max(self._held_peak, len(self._held)), len(self._held)
            return peak

    def held_floor(self, fallback: int) -> int:
        """Batches that fill the admission gate (its level in batches), plus one committing and one being claimed."""
        engine = self._engine
        gate = engine.admission if engine is not None else None
        if gate is None:
            return fallback
        return math.ceil(gate.level / max(1, self.batch_size)) + 2

    def withdraw_unstarted(self, n: int) -> int:
        """Withdraw up to ``n`` held batches none of whose conversations started; their tasks hand them back."""
        engine = self._engine
        if engine is None or n <= 0:
            return 0

        async def withdraw() -> int:
            gate = engine.admission
            return len(gate.withdraw_unstarted(n)) if gate is not None else 0

        return engine.submit(withdraw()).result(timeout=30)

    def sharing(self, floor_fallback: int):
        """What worker/batches/holding.py needs to bound this process's holding by its queues' backlog."""
        from worker.batches.backlog import HolderRegistry, make_probe
        from worker.batches.holding import Sharing, stale_after_s
        from worker.batches.ledger_calls import run_backlog

        gpus = 1
        if self.options.fake_engine:
            from worker.engine.fake import FakeEngineSpec

            gpus = FakeEngineSpec.parse(self.options.fake_engine).gpus
        registry = HolderRegistry(redis_lib.Redis.from_url(self.settings.redis_url), name=self.options.name,
                                  queues=self.options.queues, gpus=gpus,
                                  stale_s=stale_after_s(self.options.heartbeat_s))
        return Sharing(probe=make_probe(registry, lambda: run_backlog(self.sessions, self.options.queues)),
                       held=self.held_count, floor=lambda: self.held_floor(floor_fallback),
                       hand_back=self.withdraw_unstarted, gpus=gpus, period_s=self.options.heartbeat_s,
                       leave=registry.leave)

    def is_lost(self, batch_id: int) -> bool:
        with self._held_lock:
            return batch_id in self._lost

    def start_heartbeats(self) -> None:
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, name="ledger-heartbeat", daemon=True)
        self._hb_thread.start()

    def _heartbeat_loop(self) -> None:
        # On the liveness engine: no task thread waits for its connection, so however many commits
        # queue for the pool behind a slow ledger, every lease is renewed each beat (issue 36).
        while not self.shutting_down.wait(self.options.heartbeat_s):
            with self._held_lock:
                held = dict(self._held)
                held.update({b: a for b, (a, _) in self._unreleased.items()})
            try:
                lost = heartbeat(self.liveness_sessions, held)
            except Exception as e:  # noqa: BLE001 - a ledger outage must not kill the heartbeat thread
                log.warning("heartbeat failed (%s); retrying in %ss", type(e).__name__, self.options.heartbeat_s)
                continue
            if lost:
                log.warning("batches %s were taken over by a newer attempt; abandoning them", sorted(lost))
                with self._held_lock:
                    self._lost |= lost & set(self._held)
                    for batch_id in lost & set(self._unreleased):
                        del self._unreleased[batch_id]  # another attempt has it: nothing left to give back
            if self._unreleased:
                self._retry_releases(within_s=max(0.5, self.options.heartbeat_s / 2))

    # -- reconciler ---------------------------------------------------------------------------
    def start_reconciler(self, app) -> None:
        def loop() -> None:
            from ledger.reconcile import reconcile_once

            while not self.shutting_down.wait(self.options.reconcile_s):
                try:
                    # The farm runs one pass per interval, however many workers offer one (a
                    # little less than ours: the offers of one worker drift by its pass's length).
                    ledger_timing.call(lambda r: "reconcile_offer" if r is None else "reconcile_pass",
                                       reconcile_once, self.sessions, app, lease_s=self.options.lease_s,
                                       max_attempts=self.options.max_attempts,
                                       grace_s=self.options.requeue_grace_s, window=self.settings.queue_window,
                                       min_interval_s=0.8 * self.options.reconcile_s, worker=self.options.name)
                except Exception as e:  # noqa: BLE001 - the next pass retries; an outage must not kill the thread
                    log.warning("reconciler pass failed: %s: %s", type(e).__name__, e)

        threading.Thread(target=loop, name="reconciler", daemon=True).start()

    # -- shutdown ---------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        if self._shutdown_at is None:
            self._shutdown_at = time.monotonic()
        self.shutting_down.set()

    def first_to_see_engine_death(self) -> bool:
        with self._held_lock:
            first, self._engine_death_seen = not self._engine_death_seen, True
            return first

    def request_exit(self, why: str) -> None:
        """Ask Celery for a warm shutdown (in-flight batches are handed back); the launcher restarts us."""
        log.error("worker exiting: %s", why)
        with self._held_lock:  # once: the batches in flight may all ask (an engine that could not be built)
            first, self._exit_requested = not self._exit_requested, True
        self.shutting_down.set()
        if first:
            os.kill(os.getpid(), signal.SIGTERM)

    def close(self) -> None:
        if self._unreleased:
            # A last try for the hand-backs that gave up; what is still left goes to its lease.
            self._retry_releases(within_s=max(0.5, self.hand_back_left_s()))
            if left := self.unreleased():
                # Recorded again (one round trip), the TTL from now: excused however long the outage has lasted.
                recorded = self._record_hand_backs(left)
                log.warning("batches %s could not be handed back; their leases expire in %.0f s, %s", sorted(left),
                            self.options.lease_s, "with no failure counted (recorded in Redis)" if recorded
                            else "each a failure counted unless recorded earlier")
        if self._engine is not None:
            self._engine.shutdown()
        self.db.dispose()
        self.liveness_db.dispose()
        if self._records_client is not None:
            self._records_client.close()
