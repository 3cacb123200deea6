"""Nothing a launcher started outlives it, however the launcher goes (issue 27).

The launcher (worker/launcher.py) tags every worker process it starts with an
environment marker, ``REGEN_WORKER_TAG=<launch id>/<child>``, and every process the
worker starts inherits it: vLLM's engine core (forked or spawned), its executor
workers, torch's compile workers. Beside its workers the launcher starts this
reaper, a tiny process in a session of its own whose stdin is the read end of a
pipe; the launcher holds the only write end and never writes. When the launcher is
gone, by SIGKILL, the OOM killer or a crash, the kernel closes that end and the
reaper's read returns EOF. The reaper then stops every process carrying the
launch id (``stop_tagged``) and exits:

1. SIGTERM to each worker process (a tagged session leader whose parent is not
   tagged): it hands its batches back and shuts its engine down, as on preemption;
2. once those have exited, or after ``REAP_GRACE_S``, SIGKILL to every tagged
   process and every process group one of them leads, until none is left.

Why a separate process, not a signal handler or PR_SET_PDEATHSIG alone: vLLM's
engine core ignores SIGTERM until its model is loaded (it only records it); a
Python handler runs only in the main thread between bytecodes, not during a long
C call; PDEATHSIG fires when the *thread* that forked the child exits (AsyncLLM
forks its engine from regen's event-loop thread) and is lost if the parent dies
between fork and prctl. The reaper needs nothing from the processes it stops, and
cannot become an orphan itself: it exits once they are gone, within 20 s.

Processes are found by their tag alone, never by name: other launchers on the node
(one per GPU set, or a second farm) carry other launch ids and are left alone.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

#: The environment marker every process of a launcher's workers carries.
TAG_ENV = "REGEN_WORKER_TAG"
#: Time a worker process gets to hand its batches back after SIGTERM before everything is
#: SIGKILLed; with the kill itself this keeps a dead launcher's processes under 20 s.
REAP_GRACE_S = 10.0
#: How long SIGKILLs are repeated for processes that take time to die (a GPU context's teardown).
KILL_FOR_S = 8.0
_POLL_S = 0.2
_NEEDLE = f"{TAG_ENV}=".encode()


@dataclass(frozen=True)
class Tagged:
    pid: int
    ppid: int
    pgrp: int
    session: int


def _tag_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:  # gone, or not ours to read (another user's process is never ours)
        return None
    for item in env.split(b"\0"):
        if item.startswith(_NEEDLE):
            return item[len(_NEEDLE):].decode(errors="replace")
    return None


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])


def matches(tag: str, key: str) -> bool:
    """``key`` is a launch id (every worker of a launcher) or a launch id/child (one worker)."""
    return tag == key or tag.startswith(key + "/")


def tagged_processes(key: str) -> dict[int, Tagged]:
    """Every live (not zombie) process of this machine whose tag matches ``key``, but this one."""
    me = os.getpid()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        tag = _tag_of(pid)
        if tag is None or not matches(tag, key):
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        found[pid] = Tagged(pid, *stat[1:])
    return found


def _signal(pid: int, sig: int, *, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tagged(key: str, *, for_s: float = KILL_FOR_S) -> int:
    """SIGKILL every process tagged ``key`` and the groups they lead, until none is left.

    A group is killed as well so that a process which dropped the tag from its
    environment still goes with its group. Returns how many processes were killed.
    """
    deadline = time.monotonic() + for_s
    killed: set[int] = set()
    groups: set[int] = set()
    while True:
        procs = tagged_processes(key)
        groups |= {p.pgrp for p in procs.values() if p.pgrp == p.pid}
        for pgrp in groups:
            _signal(pgrp, signal.SIGKILL, group=True)
        for pid in procs:
            _signal(pid, signal.SIGKILL)
        killed |= set(procs)
        if not procs or time.monotonic() > deadline:
            return len(killed)
        time.sleep(_POLL_S / 2)


def stop_tagged(key: str, *, grace_s: float = REAP_GRACE_S) -> int:
    """SIGTERM the worker processes tagged ``key``, wait for them up to ``grace_s``, then SIGKILL all.

    Only a worker process (a session leader whose parent is not tagged) gets the
    graceful SIGTERM; an engine left behind by a worker that is already gone has no
    one to hand batches back and is killed at once. Returns how many processes were found.
    """
    procs = tagged_processes(key)
    if not procs:
        return 0
    workers = [p.pid for p in procs.values() if p.session == p.pid and p.ppid not in procs]
    for pid in workers:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while workers and time.monotonic() < deadline:
        alive = tagged_processes(key)
        workers = [pid for pid in workers if pid in alive]
        if workers:
            time.sleep(_POLL_S)
    return max(len(procs), kill_tagged(key))


def main(argv: list[str]) -> int:
    key = argv[0]
    grace_s = float(argv[1]) if len(argv) > 1 else REAP_GRACE_S
    # Signals meant for the launcher (a terminal's Ctrl-C, a service manager's SIGTERM) must not
    # take the reaper first: it is what cleans up should the launcher then die uncleanly.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while os.read(0, 4096):  # nothing is ever written: only EOF, the launcher gone, ends this
        pass
    found = stop_tagged(key, grace_s=grace_s)
    if found:
        print(f"regen reaper: the launcher is gone; stopped {found} processes tagged {key}", file=sys.stderr,
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
