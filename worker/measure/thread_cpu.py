"""Where a worker process's CPU goes, by thread, without a profiler.

On an H200 a worker hands ~160 conversations a second to its engine with 100-token
answers, and all of regen's per-conversation work shares one interpreter: the engine
loop (vLLM's output handler, rendering, parsing, admission), Celery's pool threads
(decoding inputs, building shards, uploads, ledger writes), the heartbeat. Which of
them is busy is the first question when the engine runs short with work waiting
(worker/engine/occupancy.py), and the lent GPU machines have no py-spy. Linux keeps each
thread's CPU time in ``/proc/self/task/<tid>/stat``; Python knows each thread's
``native_id`` and name. Joined, they give a line a period:

    worker CPU by thread (60 s): vllm-engine-loop 21.0 s, ThreadPoolExecutor-2 5.1 s, ...

Threads Python did not start (vLLM's and torch's native ones, the main thread's C
work) count under ``other``. Elsewhere than Linux it returns nothing.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_TASKS = Path("/proc/self/task")
#: "ThreadPoolExecutor-0_3" is thread 3 of pool 0 (Celery's pool or one of vLLM's): kept as the pool.
_POOL_THREAD = re.compile(r"^(.*-\d+)_\d+$")
#: "Thread-12 (run)" is one of a kind: the trailing number is dropped.
_NUMBERED = re.compile(r"-\d+( \(.*\))?$")


def _cpu_s(tid: int | str) -> float | None:
    try:
        stat = (_TASKS / str(tid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


def group_name(name: str) -> str:
    pool = _POOL_THREAD.match(name)
    return pool[1] if pool else (_NUMBERED.sub("", name) or name)


def by_thread() -> dict[str, float]:
    """CPU seconds so far of this process's threads, summed by thread kind; ``other`` for the rest."""
    if not _TASKS.exists():
        return {}
    named = {t.native_id: group_name(t.name) for t in threading.enumerate() if t.native_id is not None}
    totals: dict[str, float] = {}
    for entry in _TASKS.iterdir():
        cpu = _cpu_s(entry.name)
        if cpu is not None:
            key = named.get(int(entry.name), "other")
            totals[key] = totals.get(key, 0.0) + cpu
    return totals


class ThreadCpu:
    """CPU by thread kind since the previous ``take`` (threads that ended take their time with them)."""

    def __init__(self) -> None:
        self._last = by_thread()

    def take(self) -> dict[str, float]:
        now = by_thread()
        delta = {k: max(0.0, v - self._last.get(k, 0.0)) for k, v in now.items()}
        self._last = now
        return dict(sorted(delta.items(), key=lambda kv: -kv[1]))


def line(seconds: float, delta: dict[str, float]) -> str:
    shown = ", ".join(f"{k} {v:.1f} s" for k, v in delta.items() if v >= 0.05) or "idle"
    # The bracket, like the occupancy line's, is for scripts: name=seconds, names without spaces.
    bracket = " ".join(f"{k.replace(' ', '_')}={v:.2f}" for k, v in delta.items())
    return f"worker CPU by thread ({seconds:.0f} s): {shown} [cpu {bracket}]"


_BRACKET = re.compile(r"\[cpu ([^\]]*)\]")


def parse_lines(lines) -> dict[str, float]:
    """The CPU-by-thread lines of a worker log, added up."""
    total: dict[str, float] = {}
    for text in lines:
        m = _BRACKET.search(text)
        if m:
            for item in m[1].split():
                name, _, value = item.rpartition("=")
                total[name] = total.get(name, 0.0) + float(value)
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))
