"""Process-wide state of one worker process (one per GPU group).

Holds what every task thread shares: the ledger sessions, the object store, the
engine (loaded once, reused) and the shutdown flag; and composes the batch path's
bookkeeping, each in a class of its own: the attempts in flight (``held``,
worker/batches/held.py), the hand-backs (``hand_backs``, worker/batches/hand_backs.py)
and the heartbeat that keeps both's leases (worker/process/heartbeat.py).
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

from ledger.db import make_engine, make_sessionmaker
from ledger.errors import RegenError
from ledger.model_path import resolve_model
from ledger.objects import ObjectStore
from ledger.settings import Settings
from worker.batches.hand_backs import HandBacks
from worker.batches.held import HeldBatches
from worker.conversation.rendering import Renderer
from worker.engine.admission import ASSUMED_BATCH_SIZE
from worker.engine.build_errors import never_builds
from worker.engine.host import EngineHost
from worker.engine.mtp import mtp_engine_args, mtp_tokens_of
from worker.measure import ledger_timing
from worker.process.heartbeat import Heartbeat
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
        #: The one-line reason, where no retry could build it (worker/engine/build_errors.py): the process stops for good.
        self.engine_never_builds: str | None = None
        #: The (batch, attempt)s in flight: what the heartbeat keeps, and which a newer attempt took over.
        self.held = HeldBatches()
        #: What this process handed back: not taken again at once, released however slow the ledger.
        self.hand_backs = HandBacks(settings.redis_url, worker=options.name, probe_period_s=options.heartbeat_s)
        self.heartbeat = Heartbeat(self.liveness_sessions, self.held, self.hand_backs, period_s=options.heartbeat_s,
                                   lease_s=options.lease_s, stop=self.shutting_down)
        #: Guards the process-wide flags and counters below, set by many task threads.
        self._flags_lock = threading.Lock()
        self._shutdown_at: float | None = None
        self._engine_death_seen = False
        self._exit_requested = False
        #: Samples in the last batch read: how many batches fill the admission gate (``held_floor``).
        self.batch_size = ASSUMED_BATCH_SIZE
        #: Deliveries this process refused because it runs the fake engine and the run is not a benchmark run.
        self.fake_refusals = 0

    # -- engine ---------------------------------------------------------------------------
    def engine_for(self, model: str, *, benchmark: bool = False,
                   mtp: int | None = None) -> tuple[EngineHost, Renderer]:
        """The process's engine, loaded on first use. A process serves one model.

        ``benchmark``: the batch's run was submitted with ``--benchmark``. The fake engine serves
        no other (the claim already refused them: this is the second lock on the same door).
        ``mtp``: the tokens the run's MTP head drafts a step (its record's ``mtp_tokens``, worker/engine/mtp.py):
        an engine is built with it, and one built otherwise refuses the run, whose config hash names it.
        None (a worker's ``--model`` preload): the engine its own ``--engine-arg``s build, unchecked.

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
                engine = EngineHost(model=model, engine_args={**mtp_engine_args(mtp or 0), **self.options.engine_args})
                self._build(engine)
                self._renderer = Renderer(engine.tokenizer, engine.max_model_len)
            elif self._engine.model != model:
                raise WrongModel(f"this worker serves {self._engine.model}, not {model}")
            drafts = mtp_tokens_of(getattr(self._engine, "chosen_args", None) or {})
            if mtp is not None and not self.options.fake_engine and drafts != mtp:
                raise WrongModel(f"this worker's engine drafts {drafts} MTP tokens a step and the run asks for {mtp} "
                                 "(--mtp): its config hash names its choice")
            assert self._renderer is not None
            return self._engine, self._renderer

    def _build(self, engine: EngineHost) -> None:
        """Start ``engine`` as the process's engine; a failure to build it is this worker's (EngineUnavailable).

        One that no retry can mend (worker/engine/build_errors.py) also sets ``engine_never_builds``: the
        process then exits with ``EXIT_ENGINE_NEVER_BUILDS``, which its launcher does not restart.
        """
        try:
            engine.start()
        except Exception as e:
            never = never_builds(e, engine.model)
            if never is not None:
                self.engine_never_builds = never
                self._build_error = f"this worker's engine for {engine.model} can never be built: {never}"
            else:
                self._build_error = f"this worker could not build its engine for {engine.model}: {type(e).__name__}: {e}"
            with contextlib.suppress(Exception):  # what the failed build left running; the process exits next
                engine.shutdown()
            raise EngineUnavailable(self._build_error) from e
        self._engine = engine

    def count_fake_refusal(self) -> int:
        """One more real run's delivery refused by this fake-engine process; the total so far."""
        with self._flags_lock:
            self.fake_refusals += 1
            return self.fake_refusals

    @property
    def engine(self) -> EngineHost | None:
        return self._engine

    # -- in-flight batches, for the holding controller ------------------------------------------
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
                       held=self.held.count, floor=lambda: self.held_floor(floor_fallback),
                       hand_back=self.withdraw_unstarted, gpus=gpus, period_s=self.options.heartbeat_s,
                       leave=registry.leave)

    def start_heartbeats(self) -> None:
        self.heartbeat.start()

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
                                       min_interval_s=0.8 * self.options.reconcile_s, worker=self.options.name,
                                       may_expire=self.heartbeat.ledger_steady)
                except Exception as e:  # noqa: BLE001 - the next pass retries; an outage must not kill the thread
                    log.warning("reconciler pass failed: %s: %s", type(e).__name__, e)

        threading.Thread(target=loop, name="reconciler", daemon=True).start()

    # -- shutdown ---------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        if self._shutdown_at is None:
            self._shutdown_at = time.monotonic()
        self.shutting_down.set()

    def hand_back_left_s(self) -> float:
        """Time left for a shutdown's hand-backs (``options.hand_back_s`` from the shutdown's start)."""
        start = self._shutdown_at if self._shutdown_at is not None else time.monotonic()
        return max(0.0, start + self.options.hand_back_s - time.monotonic())

    def first_to_see_engine_death(self) -> bool:
        with self._flags_lock:
            first, self._engine_death_seen = not self._engine_death_seen, True
            return first

    def request_exit(self, why: str) -> None:
        """Ask Celery for a warm shutdown (in-flight batches are handed back); the launcher restarts us."""
        log.error("worker exiting: %s", why)
        with self._flags_lock:  # once: the batches in flight may all ask (an engine that could not be built)
            first, self._exit_requested = not self._exit_requested, True
        self.shutting_down.set()
        if first:
            os.kill(os.getpid(), signal.SIGTERM)

    def close(self) -> None:
        if self.hand_backs.unreleased():
            # A last try for the hand-backs that gave up; what is still left goes to its lease.
            self.hand_backs.retry_releases(self.liveness_sessions, within_s=max(0.5, self.hand_back_left_s()))
            if left := self.hand_backs.unreleased():
                # Recorded again (one round trip), the TTL from now: excused however long the outage has lasted.
                recorded = self.hand_backs.record_all(left)
                log.warning("batches %s could not be handed back; their leases expire in %.0f s, %s", sorted(left),
                            self.options.lease_s, "with no failure counted (recorded in Redis)" if recorded
                            else "each a failure counted unless recorded earlier")
        if self._engine is not None:
            self._engine.shutdown()
        self.db.dispose()
        self.liveness_db.dispose()
        self.hand_backs.close()
