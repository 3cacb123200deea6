"""Every status in the ledger and the transitions allowed between them: in one place.

The ledger is the truth; Redis is only a dispatch channel. These transitions are
what the producer, the workers and the operator commands may do, and
``check_transition`` is called wherever a status is changed by code that can
know the old one.

Runs::

    active ──► paused ──► active        (quality gate / `regen pause`; `regen resume`)
    active ──► finished                 (no batch left pending or running)
    finished ──► active                 (`regen retry`, a resumed submit adds batches)

Batches::

    planned ──► queued ──► running ──► done
                  ▲  ▲        │   │
                  │  └────────┘   └──► dead    (failures reached the run's limit)
                  │ preempted, lease     │
                  │ expired, handed back │
                  │ by a paused run, or  │
                  │ failed (failures <   │
                  │ limit: error kept)   │
                  └──────────────────────┘ `regen retry --dead`

``planned``: rows and input shard written, not yet on the broker (a submit that
crashed here is finished by running it again). ``queued``: a message was
published. ``running``: an attempt holds it; ``batches.attempts`` is the fencing
token (every claim increments it) and ``heartbeat_at`` its lease. ``failures``
counts attempts that failed (an error, or a lease that expired with its worker
gone); preemptions do not count, so a batch on preemptible nodes never dies of them.

Samples::

    pending ──► done
       │  └──► failed ──► pending       (`regen retry --failed`)
       └─────────────────► (stays pending while its batch is requeued)

Rows that never became samples (malformed, duplicates) live in ``rejected_rows``.
"""

from __future__ import annotations

from enum import Enum


class RunStatus(str, Enum):
    ACTIVE = "active"
    PAUSED = "paused"
    FINISHED = "finished"


class BatchStatus(str, Enum):
    PLANNED = "planned"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"


class SampleStatus(str, Enum):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.ACTIVE: frozenset({RunStatus.PAUSED, RunStatus.FINISHED}),
    RunStatus.PAUSED: frozenset({RunStatus.ACTIVE}),
    RunStatus.FINISHED: frozenset({RunStatus.ACTIVE}),
}

BATCH_TRANSITIONS: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.PLANNED: frozenset({BatchStatus.QUEUED}),
    BatchStatus.QUEUED: frozenset({BatchStatus.RUNNING, BatchStatus.QUEUED}),
    # running -> running: a new attempt takes over a batch whose lease expired.
    BatchStatus.RUNNING: frozenset({BatchStatus.DONE, BatchStatus.QUEUED, BatchStatus.DEAD, BatchStatus.RUNNING}),
    BatchStatus.DEAD: frozenset({BatchStatus.QUEUED}),
    BatchStatus.DONE: frozenset(),
}

SAMPLE_TRANSITIONS: dict[SampleStatus, frozenset[SampleStatus]] = {
    SampleStatus.PENDING: frozenset({SampleStatus.DONE, SampleStatus.FAILED}),
    SampleStatus.FAILED: frozenset({SampleStatus.PENDING}),
    SampleStatus.DONE: frozenset(),
}


class IllegalTransition(ValueError):
    pass


def check_transition(table: dict, old: Enum, new: Enum) -> None:
    """Raise IllegalTransition unless ``old -> new`` is written down above."""
    if new not in table[old]:
        raise IllegalTransition(f"{type(old).__name__}: {old.value} -> {new.value} is not allowed")
