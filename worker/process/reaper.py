"""Nothing a launcher started outlives it, however the launcher goes (issue 27).

The launcher (worker/process/launcher.py) starts each worker process in a session of its
own; every process the worker starts stays in that session (vLLM's engine core,
forked or spawned, its executor workers, torch's compile workers: none calls
setsid). Beside its workers the launcher starts this reaper, a tiny process in a
session of its own whose stdin is the read end of a pipe; the launcher holds the
only write end, and writes ``+<session>`` when it starts a worker and
``-<session>`` once it has reaped one. When the launcher is gone, by SIGKILL, the
OOM killer or a crash, the kernel closes that end and the reaper's read returns
EOF. The reaper then stops every process of those sessions (``stop``) and exits:

1. SIGTERM to each worker process (a session's leader): it hands its batches
   back and shuts its engine down, as on preemption;
2. once those have exited, or after ``REAP_GRACE_S``, SIGKILL to every process
   of the sessions, until none is left.

A session id is not reused while any process of it lives, so the reaper cannot
hit another launcher's processes. Every worker also carries an environment tag,
``REGEN_WORKER_TAG=<launch id>/<child>``, inherited by what it starts: it covers a
launcher killed between starting a worker and writing its session, and a process
that left the session. The tag alone is not enough: ``setproctitle`` (vLLM's
engine core, Celery) overwrites /proc/<pid>/environ, so a titled process no longer
shows it.

Why a separate process, not a signal handler or PR_SET_PDEATHSIG alone: vLLM's
engine core ignores SIGTERM until its model is loaded (it only records it); a
Python handler runs only in the main thread between bytecodes, not during a long
C call; PDEATHSIG fires when the *thread* that forked the child exits (AsyncLLM
forks its engine from regen's event-loop thread) and is lost if the parent dies
between fork and prctl. The reaper needs nothing from the processes it stops, and
cannot become an orphan itself: it exits once they are gone, within 20 s.
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
class Proc:
    pid: int
    ppid: int
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


def _stat(pid: int) -> Proc | None:
    """The process, None when it is gone or a zombie (dead already, waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return Proc(pid, ppid=int(fields[1]), session=int(fields[3]))


def matches(tag: str, key: str) -> bool:
    """``key`` is a launch id (every worker of a launcher) or a launch id/child (one worker)."""
    return tag == key or tag.startswith(key + "/")


def _scan(key: str, sessions: set[int]) -> dict[int, Proc]:
    me = os.getpid()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        proc = _stat(int(name))
        if proc is None:
            continue
        if proc.session in sessions or ((tag := _tag_of(proc.pid)) is not None and matches(tag, key)):
            found[proc.pid] = proc
    return found


def processes_of(key: str, sessions: set[int]) -> dict[int, Proc]:
    """Every live process of these sessions or tagged ``key``, and of the sessions tagged ones lead.

    ``sessions`` grows with those found, so a session whose leader has died since is still
    followed by the next call.
    """
    found = _scan(key, sessions)
    led = {p.session for p in found.values() if p.pid == p.session} - sessions
    if led:
        sessions |= led
        found = _scan(key, sessions)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill(key: str, sessions: set[int], *, for_s: float = KILL_FOR_S) -> int:
    """SIGKILL every process of ``sessions`` or tagged ``key`` until none is left; how many were killed."""
    deadline = time.monotonic() + for_s
    killed: set[int] = set()
    while True:
        procs = processes_of(key, sessions)
        for pid in procs:
            _signal(pid, signal.SIGKILL)
        killed |= set(procs)
        if not procs or time.monotonic() > deadline:
            return len(killed)
        time.sleep(_POLL_S / 2)


def stop(key: str, sessions: set[int], *, grace_s: float = REAP_GRACE_S) -> int:
    """SIGTERM the worker processes, wait for them up to ``grace_s``, then SIGKILL everything left.

    Only a worker process (the leader of a session the launcher named) gets the
    graceful SIGTERM; an engine left behind by a worker that is already gone has no
    one to hand batches back and is killed at once, and so is a worker the launcher
    died too soon to name (it has just started: no batch, no engine yet). Returns
    how many processes were found.
    """
    started = set(sessions)  # the launcher's worker processes: each leads the session it was started in
    procs = processes_of(key, sessions)
    if not procs:
        return 0
    workers = [pid for pid in procs if pid in started]
    for pid in workers:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while workers and time.monotonic() < deadline:
        alive = processes_of(key, sessions)
        workers = [pid for pid in workers if pid in alive]
        if workers:
            time.sleep(_POLL_S)
    return max(len(procs), kill(key, sessions))


def read_sessions(fd: int) -> set[int]:
    """Follow the launcher's ``+sid``/``-sid`` lines until EOF; the sessions it left running.

    A line cut short by the launcher's death is ignored: its worker still carries the tag.
    """
    sessions: set[int] = set()
    pending = b""
    while chunk := os.read(fd, 4096):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line[:1] in (b"+", b"-") and line[1:].isdigit():
                (sessions.add if line[:1] == b"+" else sessions.discard)(int(line[1:]))
    return sessions


def main(argv: list[str]) -> int:
    key = argv[0]
    grace_s = float(argv[1]) if len(argv) > 1 else REAP_GRACE_S
    # Signals meant for the launcher (a terminal's Ctrl-C, a service manager's SIGTERM) must not
    # take the reaper first: it is what cleans up should the launcher then die uncleanly.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sessions = read_sessions(0)  # returns at EOF: the launcher is gone, or done
    found = stop(key, sessions, grace_s=grace_s)
    if found:
        print(f"regen reaper: launcher {key} is gone; stopped the {found} processes it left", file=sys.stderr,
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
