"""No orphans: a child process that must not outlive the process that started it.

Linux's PR_SET_PDEATHSIG, set in the child between fork and exec (``preexec_fn``):
when the parent dies, even by SIGKILL, the child gets ``sig``. Used for the worker
processes a launcher starts (they then hand their batches back and stop their
engines), the moto server a test or benchmark starts, and a benchmark's workers.
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1
#: Tells a worker process which pid is its launcher, so it can stop when the launcher is gone.
LAUNCHER_PID_ENV = "REGEN_LAUNCHER_PID"


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Call in the child before exec; a no-op off Linux (callers keep their own watch)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
