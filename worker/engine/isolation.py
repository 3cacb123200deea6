"""One batch's conversations on the engine, as an engine death needs them (issue 58, item 4).

``Flight`` is what worker/conversation/generation.py keeps while a batch runs: which of its
conversations have started and not ended (the suspects of a death), and which of them run
*isolated*. A sample that was in flight at an earlier death (ledger/crash_suspects.py) runs
isolated: it takes the engine's isolation lock for its whole conversation, so at most one
isolated sample is in flight per engine. The others beside it were never in a crash, so an
engine that dies with an isolated sample in flight names that sample.

The sets are written on the engine's event loop and read by the batch's task thread once the
engine has died (its loop stopped or its requests failed): a conversation leaves ``started``
only when it ends, never when an engine failure unwinds it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Flight:
    #: Samples to run isolated (in flight at an earlier engine death).
    isolate: frozenset[str] = frozenset()
    #: Samples failed with reason ``engine_crash`` without running: sample id -> deaths it was in flight at.
    condemned: dict[str, int] = field(default_factory=dict)
    #: Started (admitted to the engine) and not ended.
    started: set[str] = field(default_factory=set)
    #: Of them, the one running isolated, if any.
    isolated: set[str] = field(default_factory=set)


def isolation_lock(engine) -> asyncio.Lock:
    """The engine's isolation lock (one isolated conversation at a time), made on first use on its loop."""
    lock = getattr(engine, "_isolation_lock", None)
    if lock is None:
        lock = asyncio.Lock()
        engine._isolation_lock = lock
    return lock
