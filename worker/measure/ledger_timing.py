"""Client-side latency of the worker's ledger calls, by kind: a benchmark switch, off unless asked for.

``REGEN_LEDGER_TIMING=<folder>`` (read once at a worker's start, never at import) makes each
process append what its ledger calls took to ``<folder>/<pid>.jsonl``: one line per kind
and flush, ``{"kind": "commit", "t": [wall clock s...], "ms": [...]}``. bench/farm.py sets it
and reads the files back for p50/p99 per kind over its measuring window. Off (the default)
each timed call costs one ``is None`` test.

Why client-side and not ``pg_stat_statements``: that extension must be preloaded at the
server's start, and the machine's Postgres is shared; a worker's view (the whole
transaction, the pool wait and retries included) is also what a slow ledger costs the GPU.

Kinds: ``claim``, ``heartbeat``, ``commit``, ``release``, ``fail`` (worker/batches/ledger_calls.py),
``gate`` (the due check after every commit), ``gate_pass`` (an evaluation), ``reconcile_offer``
(another worker's pass was recent or running), ``reconcile_pass``. And one that is not a
duration: ``sequence`` (worker/engine/fake.py), one per answer the fake engine ended, its
``ms`` field holding the answer's tokens, so that the bench counts the samples and tokens that
ended inside its window (a commit's time would credit work done before it).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ENV = "REGEN_LEDGER_TIMING"
#: Seconds between appends to the file: a killed process loses at most this much.
FLUSH_S = 2.0

F = TypeVar("F", bound=Callable[..., Any])


class Recorder:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))

    def add(self, kind: str, seconds: float) -> None:
        self.add_value(kind, seconds * 1000)

    def add_value(self, kind: str, value: float) -> None:
        with self._lock:
            t, ms = self._pending[kind]
            t.append(round(time.time(), 3))
            ms.append(round(value, 3))

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, defaultdict(lambda: ([], []))
        if pending:
            with open(self.path, "a") as f:
                for kind, (t, ms) in pending.items():
                    f.write(json.dumps({"kind": kind, "t": t, "ms": ms}) + "\n")


_recorder: Recorder | None = None


def install(folder: str | Path) -> Recorder:
    """Record this process's timed calls into ``folder`` (created), flushed every ``FLUSH_S`` and at exit."""
    global _recorder
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(folder / f"{os.getpid()}.jsonl")
    _recorder = recorder

    def loop() -> None:
        while _recorder is recorder:
            time.sleep(FLUSH_S)
            try:
                recorder.flush()
            except OSError:
                return  # the folder is gone: its reader has finished

    threading.Thread(target=loop, name="ledger-timing", daemon=True).start()
    atexit.register(_flush_quietly, recorder)
    return recorder


def _flush_quietly(recorder: Recorder) -> None:
    try:
        recorder.flush()
    except OSError:
        pass  # the folder is gone: its reader has finished


def install_from_env() -> Recorder | None:
    folder = os.environ.get(ENV)
    return install(folder) if folder else None


def record(kind: str, seconds: float) -> None:
    if _recorder is not None:
        _recorder.add(kind, seconds)


#: The kind whose values are an ended answer's tokens, not milliseconds.
SEQUENCE = "sequence"


def record_sequence(tokens: int) -> None:
    """An answer of ``tokens`` tokens ended now (the fake engine's; read by bench/farm.py)."""
    if _recorder is not None:
        _recorder.add_value(SEQUENCE, tokens)


def timed(kind: str) -> Callable[[F], F]:
    """Decorate a ledger call: its wall time is recorded under ``kind`` when the switch is on."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if _recorder is None:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _recorder.add(kind, time.perf_counter() - start)
        return inner  # type: ignore[return-value]
    return wrap


def call(kind_of: Callable[[Any], str], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, recorded under ``kind_of(its result)`` (a gate check vs a gate pass)."""
    if _recorder is None:
        return fn(*args, **kwargs)
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    _recorder.add(kind_of(result), time.perf_counter() - start)
    return result


def flush() -> None:
    """Append what this process recorded so far (a reader is about to look)."""
    if _recorder is not None:
        _recorder.flush()
