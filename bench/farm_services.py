"""bench/farm.py's services: a scratch ledger behind a real PgBouncer (transaction mode), a Redis of
its own, moto; the production reaper over the bench's processes; and the sampler of connections,
lock waits, Redis memory and Redis commands.

Nothing the bench starts outlives it, even killed with SIGKILL (an earlier run's 8 orphaned
workers once used 1.5 of the 2 cores under a recorded run): moto and Redis die with it
(PR_SET_PDEATHSIG, local/), and the worker processes and PgBouncer are watched by the same
reaper ``regen worker``'s launcher starts (worker/process/reaper.py): the bench plays the
launcher, tells it each worker's session and tags PgBouncer (which, started as ``nobody`` by
root, loses a parent-death signal when it changes user). When the bench is gone the reaper
stops them all within ~20 s.

The Redis is the bench's own (a ``redis-server`` on a free port, nothing saved) so its memory and
command figures are the farm's alone; the ledger is a scratch database on the machine's Postgres
(bench/scratch.py), so the server connections counted are that database's backends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import psycopg
import redis as redis_lib

from bench.scratch import DEFAULT_ADMIN_DSN, Scratch, scratch_services
from local.pgbouncer import running_pgbouncer
from local.s3 import free_port
from local.services import local_redis
from worker.process.launcher import REAPER_EXIT_WAIT_S
from worker.process.launcher import _Reaper as Reaper  # the launcher's own: the farm's workers live as theirs
from worker.process.reaper import TAG_ENV

#: Server connections PgBouncer may open to the ledger. The issue's goal is <= 500 through the pooler;
#: 40 is far below it and leaves the machine's Postgres (max_connections 100) room for everyone else.
POOL_SIZE = 40
#: Client connections PgBouncer accepts: 1,000 GPU processes x 4 (worker/process/runtime.py), with room.
MAX_CLIENT_CONN = 5000


@dataclass
class Farm:
    scratch: Scratch
    #: The ledger through PgBouncer: what every worker and ledger-only thread uses.
    pooled_url: str
    #: PgBouncer's admin console (SHOW POOLS).
    console_url: str
    redis_url: str
    pool_size: int
    #: The production reaper (worker/process/reaper.py) of this bench's workers and PgBouncer.
    reaper: Reaper

    @property
    def launch_id(self) -> str:
        """What the reaper finds this bench's processes by (``REGEN_WORKER_TAG=<launch id>/...``)."""
        return self.reaper.launch_id

    def env(self, timing_dir: str) -> dict[str, str]:
        """A worker's environment: the pooled ledger, the bench's Redis, moto, the timing switch."""
        return {**self.scratch.env(), "DATABASE_URL": self.pooled_url, "REGEN_DB_POOLER": "transaction",
                "REDIS_URL": self.redis_url, "REGEN_LEDGER_TIMING": timing_dir, "PYTHONUNBUFFERED": "1"}

    @property
    def settings(self):
        return dataclasses.replace(self.scratch.settings, database_url=self.pooled_url,
                                   database_pooler="transaction", redis_url=self.redis_url)


@contextlib.contextmanager
def _pgbouncer(direct_url: str, pool_size: int, launch_id: str) -> Iterator[tuple[str, str]]:
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.access(binary, os.X_OK):
        raise SystemExit("bench/farm.py needs PgBouncer: apt-get install -y pgbouncer")
    parts = urlsplit(direct_url)
    user, database = parts.username or "postgres", parts.path.lstrip("/")
    # A Unix socket's folder (an embedded Postgres: ``?host=/dir``) or a TCP host.
    host = parse_qs(parts.query).get("host", [parts.hostname or "127.0.0.1"])[0]
    workdir = tempfile.mkdtemp(prefix="regen-farm-pgbouncer-")
    os.chmod(workdir, 0o777)  # run as nobody when we are root: it writes its log here
    port = free_port()
    with open(os.path.join(workdir, "users.txt"), "w") as f:
        f.write(f'"{user}" ""\n')
    config = os.path.join(workdir, "pgbouncer.ini")
    with open(config, "w") as f:
        f.write(f"""[databases]
{database} = host={host} port={parts.port or 5432} dbname={database} user={user}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/users.txt
admin_users = {user}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = {MAX_CLIENT_CONN}
logfile = {workdir}/pgbouncer.log
pidfile = {workdir}/pgbouncer.pid
""")
    # As root PgBouncer must name a user to run as: nobody, or for a Unix socket (an embedded Postgres,
    # whose socket is in its 0700 data folder) the socket folder's owner, who alone can reach it.
    run_as = pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") else "nobody"
    argv = [binary, config] if os.geteuid() != 0 else [binary, "-u", run_as, config]
    url = f"postgresql://{user}@127.0.0.1:{port}/{database}"
    env = {**os.environ, TAG_ENV: f"{launch_id}/pgbouncer"}  # found by the reaper should the bench die
    with running_pgbouncer(argv, url, workdir, env=env, why=lambda: f"see {workdir}/pgbouncer.log"):
        yield url, f"postgresql://{user}@127.0.0.1:{port}/pgbouncer"


@contextlib.contextmanager
def farm_services(*, admin_dsn: str = DEFAULT_ADMIN_DSN, pool_size: int = POOL_SIZE) -> Iterator[Farm]:
    # The reaper first: from PgBouncer's start on, a death of the bench is covered.
    reaper = Reaper(f"farm-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    reaper.start()
    try:
        with local_redis(port=free_port()) as (redis_url, _), \
                scratch_services(admin_dsn=admin_dsn, redis_url=redis_url, prefix="regen_farm") as scratch, \
                _pgbouncer(scratch.settings.database_url, pool_size, reaper.launch_id) as (pooled, console):
            yield Farm(scratch=scratch, pooled_url=pooled, console_url=console, redis_url=redis_url,
                       pool_size=pool_size, reaper=reaper)
    finally:
        reaper.close(wait_s=REAPER_EXIT_WAIT_S)  # it checks for leftovers, finds none, exits


@dataclass
class Samples:
    """What the sampler saw over one window, once a second."""
    server_conns: list[int] = field(default_factory=list)
    client_conns: list[int] = field(default_factory=list)
    waiting_clients: list[int] = field(default_factory=list)
    redis_used: list[int] = field(default_factory=list)
    redis_commands: list[tuple[float, int]] = field(default_factory=list)
    #: The ledger database's client backends running a statement, and of them those waiting on a lock.
    active_backends: list[int] = field(default_factory=list)
    lock_waits: list[int] = field(default_factory=list)

    def lock_share(self) -> float | None:
        """Of the active backends seen, the share waiting on a lock (heavyweight: rows, tables, advisory)."""
        active = sum(self.active_backends)
        return sum(self.lock_waits) / active if active else None

    def commands_s(self) -> float:
        if len(self.redis_commands) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self.redis_commands[0], self.redis_commands[-1]
        return (c1 - c0) / max(1e-9, t1 - t0)


class Sampler:
    """Every ``interval_s`` (1 s): the ledger database's client backends (pg_stat_activity, less the
    sampler's own), how many run a statement and how many of those wait on a lock, PgBouncer's client
    and server connections (SHOW POOLS), Redis used_memory and commands."""

    def __init__(self, farm: Farm, interval_s: float = 1.0):
        self.farm = farm
        self.interval_s = interval_s
        self.samples = Samples()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        direct = self.farm.scratch.settings.database_url
        database = self.farm.scratch.database_name
        redis = redis_lib.Redis.from_url(self.farm.redis_url)
        # prepare_threshold=None: psycopg prepares a query run 5 times, and PgBouncer's admin console,
        # which speaks the simple protocol only, then closes the connection (the sampler once saw 5 s).
        with psycopg.connect(direct, autocommit=True, prepare_threshold=None) as pg, \
                psycopg.connect(self.farm.console_url, autocommit=True, prepare_threshold=None) as console:
            while not self._stop.wait(self.interval_s):
                with contextlib.suppress(psycopg.Error, redis_lib.RedisError):
                    backends, active, locked = pg.execute(
                        "SELECT count(*), count(*) FILTER (WHERE state = 'active'), "
                        "count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock') "
                        "FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend' "
                        "AND pid <> pg_backend_pid()", (database,)).fetchone()
                    cur = console.execute("SHOW POOLS")
                    names = [d.name for d in cur.description]
                    pools = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
                    pools = [p for p in pools if p["database"] == database]
                    self.samples.server_conns.append(backends)
                    self.samples.active_backends.append(active)
                    self.samples.lock_waits.append(locked)
                    self.samples.client_conns.append(sum(p["cl_active"] + p["cl_waiting"] for p in pools))
                    self.samples.waiting_clients.append(sum(p["cl_waiting"] for p in pools))
                    self.samples.redis_used.append(int(redis.info("memory")["used_memory"]))
                    self.samples.redis_commands.append(
                        (time.monotonic(), int(redis.info("stats")["total_commands_processed"])))
        redis.close()

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, name="farm-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
