"""Every setting of a worker process and its default, declared once.

``regen worker``'s options (producer/cli.py) and ``python -m worker.process.consumer``'s
flags take their defaults from these fields. Light on purpose: the CLI imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger.defaults import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    DEFAULT_RECONCILE_S,
    QUEUED_GRACE_S,
)
from worker.process.reaper import REAP_GRACE_S

#: How long a shutdown's hand-backs may take, from the SIGTERM on, each release included: well
#: within the grace the reaper gives a worker before its SIGKILL (worker/process/reaper.py; the
#: launcher's own 60 s is the longer), so a hand-back is never cut short, and what is left of the
#: grace goes to the engine's shutdown. A release that cannot land by then is left to its lease.
HAND_BACK_S = 0.6 * REAP_GRACE_S
#: How long a release outside a shutdown (a hand-back, a wrong model, a dead engine) is retried
#: before it gives up and is left to the heartbeat's retries: a Postgres restart is over within it.
RELEASE_WITHIN_S = 20.0


@dataclass(frozen=True)
class WorkerOptions:
    name: str
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    #: Batches this process holds (Celery threads; each batch claimed and leased).
    #: 0 = auto: start from the engine's max_num_seqs (worker/engine/admission.py
    #: ``batches_to_hold``) and hold more while the engine starves (worker/batches/holding.py).
    concurrency: int = 0
    model: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    #: A running batch whose heartbeat is older than this is presumed lost and may be
    #: claimed again: 6 missed heartbeats, so a GC pause or a slow ledger is no crash,
    #: while a dead node's batches are back in work within lease + reconcile_s (< 60 s).
    lease_s: float = DEFAULT_LEASE_S
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    #: Failed attempts before a batch is declared dead (never retried in a loop).
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: How often this worker offers to run the reconciler (one pass at a time cluster-wide).
    reconcile_s: float = DEFAULT_RECONCILE_S
    #: A queued batch whose message is neither waiting on its queue nor claimed this long
    #: after it was published gets a new one from the reconciler (ledger/reconcile.py).
    requeue_grace_s: float = QUEUED_GRACE_S

    #: How long a shutdown's hand-backs may take from the SIGTERM on: below the reaper's grace
    #: (``HAND_BACK_S`` above); a test shortens it, nothing else should.
    hand_back_s: float = HAND_BACK_S
    #: ``RELEASE_WITHIN_S`` above; a test shortens it.
    release_s: float = RELEASE_WITHIN_S

    #: worker/engine/fake.py's spec (``tok_s=...,gpus=...``): a benchmark and test device that
    #: makes token ids instead of generating. Only ever set by an explicit ``--fake-engine``.
    fake_engine: str | None = None

    #: Wall-clock time (epoch seconds) after which this process takes no new batch: it stops
    #: consuming, lets the batches it holds commit, and waits for SIGTERM (worker/process/deadline.py).
    #: Set by ``regen worker`` from a SLURM job's end (worker/process/slurm.py); None: never.
    stop_taking_at: float | None = None
    #: How long before a SLURM job's end its workers stop taking batches. At the sizing assumptions
    #: (docs/deploy.md: 0.10 commits/s per GPU) a GPU commits a batch every ~10 s, so 10 min commits
    #: ~60 of the ~122 it holds; the rest are handed back at the job's ``--signal=B:TERM@<grace>``.
    #: Longer wastes GPU time at the end as the engine empties; 0 turns the drain off.
    drain_before_end_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.hand_back_s < REAP_GRACE_S:
            raise ValueError(f"hand_back_s must be above 0 and below the reaper's grace of {REAP_GRACE_S:.0f} s, "
                             f"got {self.hand_back_s}")

    def held_batches(self, max_num_seqs: int) -> int:
        """The Celery threads to start: ``concurrency`` if set, else derived from the engine."""
        # Imported here: admission imports asyncio (~20 ms), and the CLI imports this module for
        # its defaults on every command, `regen status` included.
        from worker.engine.admission import batches_to_hold

        return self.concurrency if self.concurrency > 0 else batches_to_hold(max_num_seqs)


