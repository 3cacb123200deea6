"""Every status in the ledger and the transitions allowed between them: in one place.

The ledger is the truth; Redis is only a dispatch channel. These transitions are
what the producer, the workers and the operator commands may do. They are carried
out in one module, ledger/transitions.py, and tests/unit/test_transitions.py holds
every status write there against the tables below (with ``check_transition``) and
fails on a status write anywhere else.

Runs (created ``active``)::

    active ──► paused ──► active        (the quality gate; `regen resume`)
                                        (and at once finished if nothing is left to run)
    active ──► finished                 (no batch left planned, queued or running)
    finished ──► active                 (`regen retry`, a resumed submit adds batches)

Batches (created ``planned`` by submit, ``queued`` by `regen retry --failed`)::

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

Samples (created ``pending``)::

    pending ──► done
       │  └──► failed ──► pending       (`regen retry --failed`)
       └─────────────────► (stays pending while its batch is requeued)

Rows that never became samples (malformed, duplicates) live in ``rejected_rows``.
"""

from __future__ import annotations

from enum import Enum

from ledger.errors import RegenError


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
    # planned -> running: a worker may take the message before submit marks its batch queued.
    BatchStatus.PLANNED: frozenset({BatchStatus.QUEUED, BatchStatus.RUNNING}),
    BatchStatus.QUEUED: frozenset({BatchStatus.RUNNING, BatchStatus.QUEUED}),
    # running -> running: a new attempt takes over a batch whose lease expired.
    BatchStatus.RUNNING: frozenset({BatchStatus.DONE, BatchStatus.QUEUED, BatchStatus.DEAD, BatchStatus.RUNNING}),
    BatchStatus.DEAD: frozenset({BatchStatus.QUEUED}),
    BatchStatus.DONE: frozenset(),
}

#: The statuses a new row may start in.
RUN_INITIAL: frozenset[RunStatus] = frozenset({RunStatus.ACTIVE})
BATCH_INITIAL: frozenset[BatchStatus] = frozenset({BatchStatus.PLANNED, BatchStatus.QUEUED})
SAMPLE_INITIAL: frozenset[SampleStatus] = frozenset({SampleStatus.PENDING})

SAMPLE_TRANSITIONS: dict[SampleStatus, frozenset[SampleStatus]] = {
    SampleStatus.PENDING: frozenset({SampleStatus.DONE, SampleStatus.FAILED}),
    SampleStatus.FAILED: frozenset({SampleStatus.PENDING}),
    SampleStatus.DONE: frozenset(),
}


class Quality(str, Enum):
    """Sample classes, worst first: a sample's class is its worst turn's (``SEVERITY``)."""

    FAILED = "failed"                            # no output at all (the sample's error says why)
    EMPTY_ANSWER = "empty_answer"                # finished turn with no answer and no tool call
    STUB_ANSWER = "stub_answer"                  # a few tokens ("OK.") and no thought behind them
    REPETITION_LOOP = "repetition_loop"          # most of a long completion repeats itself
    EMPTY_REASONING = "empty_reasoning"          # thinking on, but an empty <think></think>
    TRUNCATED_REASONING = "truncated_reasoning"  # cut off (max_tokens, abort) before </think>
    TRUNCATED_ANSWER = "truncated_answer"        # cut off after </think>, or without thinking
    BAD_THINK_TAGS = "bad_think_tags"            # unbalanced or leftover think tags
    UNOFFERED_TOOL = "unoffered_tool"            # a call to a tool the conversation did not offer
    INVALID_TOOL_JSON = "invalid_tool_json"      # a <tool_call> block that does not parse
    TOOL_ARGS_DIFFER = "tool_args_differ"        # a spliced source result answers other arguments than the call's
    OK = "ok"


#: How a refused batch's ``error`` begins: ``refused by <worker>: <why>`` (``refused_reason``). A worker
#: that cannot run a batch (another model's; parsers its vLLM cannot build) hands it back with no
#: failure counted; `regen status` counts the queued batches whose last word is a refusal, since a
#: run that no worker can serve would otherwise only wait.
REFUSED_PREFIX = "refused by "


def refused_reason(worker: str, why: str) -> str:
    """The ``error`` a refused batch is handed back with."""
    return f"{REFUSED_PREFIX}{worker}: {why}"


class IllegalTransition(RegenError, ValueError):
    """A status change that the tables above do not allow (a bug, never the user's input)."""


def check_transition(table: dict, old: Enum, new: Enum) -> None:
    """Raise IllegalTransition unless ``old -> new`` is written down above."""
    if new not in table[old]:
        raise IllegalTransition(f"{type(old).__name__}: {old.value} -> {new.value} is not allowed")
