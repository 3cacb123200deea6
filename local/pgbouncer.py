"""A PgBouncer process for the length of a block: started, waited for, stopped. Tests and benchmarks share it.

The callers differ in how PgBouncer is configured (an ini written by the farm bench or the
test fixture, or the compose image's own entrypoint turning ``PGBOUNCER_*`` variables into
one), not in its life: start the process, wait until ``url`` accepts a Postgres login (or the process exits),
and at the end terminate it, kill it after 10 s, and remove its folder.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import psycopg

#: How long a stopping PgBouncer gets after SIGTERM before SIGKILL.
STOP_WAIT_S = 10.0


def pooler_answers(url: str) -> bool:
    """Whether a Postgres connection to ``url`` opens now (through the pooler): a login, not
    local/services.py's ``answers(host, port)``, which only opens a TCP connection."""
    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


@contextlib.contextmanager
def running_pgbouncer(argv: Sequence[str], url: str, workdir: str | Path, *, env: dict[str, str] | None = None,
                      stdout: int | IO | None = subprocess.DEVNULL, stderr: int | IO | None = subprocess.DEVNULL,
                      timeout_s: float = 20.0, why: Callable[[], str] = lambda: "") -> Iterator[subprocess.Popen]:
    """Run ``argv`` until the block ends; yield the process once ``url`` answers through it.

    Raises:
        RuntimeError: it exited or did not answer within ``timeout_s``; the message ends with ``why()``
            (the caller's log, say).
    """
    process = subprocess.Popen(list(argv), env=env, stdout=stdout, stderr=stderr)
    try:
        deadline = time.monotonic() + timeout_s
        while not pooler_answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start (exit {process.poll()}; workdir {workdir}): {why()}")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(workdir, ignore_errors=True)
