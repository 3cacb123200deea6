"""The compose stack's PgBouncer, configured as docker-compose.yml configures it, under regen's worker path.

The pgbouncer service's environment is read from docker-compose.yml (interpolated as compose does,
with .env.example's values: tests/support/compose.py) and given to the image's own entrypoint,
docker/pgbouncer-entrypoint.sh, which writes pgbouncer.ini from it and starts Debian's pgbouncer,
the package the image installs. So nothing translates the settings but the image's own script.
The test replaces only where Postgres is (a fresh database on the session's server, migrated
directly as the migrate service does), who logs in, and where PgBouncer listens. The pool is the
compose's ``REGEN_PGBOUNCER_POOL``, set to 2 here as an operator's .env would set it: then two
fake-engine worker processes (up to 4 connections each), the submit and the status reads are
several times more clients than the pool has server connections.

Through it run a submit (its COPY and its transaction-level lock), two worker processes of the
fake engine (worker/engine/fake.py: claims, heartbeats, commits, the reconciler; everything but
vLLM) and ``regen status``, with every client in transaction mode as compose sets it
(``REGEN_DB_POOLER=transaction``). The run must finish with every sample done once, Postgres
must never see more connections to the database than the compose's pool, and no statement may
fail for want of a prepared statement.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from ledger import migrate
from ledger.objects import ObjectStore
from ledger.settings import Settings
from local.pgbouncer import running_pgbouncer
from producer.monitoring.metrics import STATEMENT_TIMEOUT_MS, collect, ledger_engine
from tests.fixtures.pgbouncer import _binary, _free_port
from tests.support.compose import ROOT, dummy_env, load_compose
from tests.support.helpers import output_rows, run_cli, status_json, wait_for

ENTRYPOINT = ROOT / "docker" / "pgbouncer-entrypoint.sh"
SAMPLE = ROOT / "data" / "sample"
SAMPLES = 290  # data/sample's valid rows
#: The compose's pool as a small farm's .env would set it: far fewer than the clients below.
POOL = 2
WORKERS = 2


@dataclass(frozen=True)
class ComposeBouncer:
    #: The database through the pooler, as the compose's DATABASE_URL names it (with its password).
    url: str
    #: PgBouncer's admin console (SHOW POOLS), as the compose's stats user.
    console: str
    database: str
    pool_size: int
    log_path: Path


def compose_pgbouncer_env(**overrides: str) -> dict[str, str]:
    """The pgbouncer service's environment as compose would hand it to the container."""
    service = load_compose(dummy_env(REGEN_PGBOUNCER_POOL=str(POOL)))["services"]["pgbouncer"]
    return {**{k: str(v) for k, v in service["environment"].items()}, **overrides}


@pytest.fixture
def compose_bouncer(pg_server, tmp_path) -> Iterator[ComposeBouncer]:
    binary = _binary()
    if binary is None:
        msg = "the pgbouncer binary is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI"):
            pytest.fail(msg + " - CI must provide it (.ci/run installs it)", pytrace=False)
        pytest.skip(msg)
    # A database of its own, so every connection Postgres sees to it is one PgBouncer opened.
    database = f"regen_pgb_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    migrate.upgrade(Settings(database_url=pg_server.dsn(database)))  # directly, as the migrate service
    admin_url = urlsplit(pg_server.admin_dsn)
    user = admin_url.username or getpass.getuser()
    workdir = Path(tempfile.mkdtemp(prefix="regen-pgbouncer-compose-"))
    os.chmod(workdir, 0o755)  # PgBouncer runs as nobody under root (it refuses root)
    listen = _free_port()
    env = compose_pgbouncer_env(
        DB_HOST=admin_url.hostname or "127.0.0.1", DB_PORT=str(admin_url.port or 5432), DB_NAME=database,
        DB_USER=user, PGBOUNCER_STATS_USERS=user, PGBOUNCER_LISTEN_ADDR="127.0.0.1",
        PGBOUNCER_LISTEN_PORT=str(listen), CONFIG_DIR=str(workdir / "config"))
    password = env["DB_PASSWORD"]  # the compose's POSTGRES_PASSWORD; the session's Postgres trusts its login
    log_path = tmp_path / "pgbouncer.log"
    argv = ["sh", str(ENTRYPOINT), *(["-u", "nobody"] if os.geteuid() == 0 else [])]
    path = os.pathsep.join([os.path.dirname(binary), os.environ.get("PATH", "")])
    url = f"postgresql://{user}:{password}@127.0.0.1:{listen}/{database}"
    try:
        with open(log_path, "wb") as log, \
                running_pgbouncer(argv, url, workdir, env={"PATH": path, **env}, stdout=log, stderr=subprocess.STDOUT,
                                  timeout_s=15, why=log_path.read_text):
            yield ComposeBouncer(url=url, console=f"postgresql://{user}:{password}@127.0.0.1:{listen}/pgbouncer",
                                 database=database, pool_size=POOL, log_path=log_path)
    finally:
        with psycopg.connect(pg_server.admin_dsn, autocommit=True, connect_timeout=30) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


class Watch:
    """Samples, every 50 ms, Postgres's connections to the database, PgBouncer's clients, and
    the running batches whose lease a heartbeat renewed (read through the pooler, as a client)."""

    def __init__(self, admin_dsn: str, bouncer: ComposeBouncer):
        self.admin_dsn, self.bouncer = admin_dsn, bouncer
        self.server_peak = self.client_peak = self.waiting_peak = self.heartbeats_seen = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            self._sample()
        except BaseException as e:  # noqa: BLE001 - the test asserts there was none
            self.error = e

    def _sample(self) -> None:
        # The admin console speaks only the simple query protocol: a client-side cursor's.
        with psycopg.connect(self.admin_dsn, autocommit=True) as pg, \
                psycopg.connect(self.bouncer.console, autocommit=True, cursor_factory=psycopg.ClientCursor) as console, \
                psycopg.connect(self.bouncer.url, autocommit=True, prepare_threshold=None) as ledger:
            while not self._stop.wait(0.05):
                # A claim sets heartbeat_at = started_at; only a heartbeat moves it on while running.
                (beats,) = ledger.execute("SELECT count(*) FROM batches WHERE status = 'running' "
                                          "AND heartbeat_at > started_at").fetchone()
                self.heartbeats_seen = max(self.heartbeats_seen, beats)
                (servers,) = pg.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                                        "AND backend_type = 'client backend'",
                                        (self.bouncer.database,)).fetchone()
                self.server_peak = max(self.server_peak, servers)
                cur = console.execute("SHOW POOLS")
                names = [c.name for c in cur.description]
                for row in cur.fetchall():
                    pool = dict(zip(names, row, strict=True))
                    if pool["database"] == self.bouncer.database:
                        self.client_peak = max(self.client_peak, pool["cl_active"] + pool["cl_waiting"])
                        self.waiting_peak = max(self.waiting_peak, pool["cl_waiting"])


def test_the_compose_pgbouncer_carries_a_fake_engine_farm_within_its_pool(compose_bouncer, pg_server, redis_url,
                                                                          s3_env, s3_bucket, tmp_path):
    bouncer = compose_bouncer
    # What the compose's regen containers get (x-regen-env), pointed at this pooler.
    regen_env = load_compose(dummy_env())["x-regen-env"]
    assert regen_env["REGEN_DB_POOLER"] == "transaction"
    env = {**os.environ, **s3_env, "DATABASE_URL": bouncer.url, "REDIS_URL": redis_url,
           "REGEN_DB_POOLER": regen_env["REGEN_DB_POOLER"], "PYTHONUNBUFFERED": "1"}
    output = f"{s3_bucket}/regen/pooled"
    logs = [tmp_path / f"worker{i}.log" for i in range(WORKERS)]
    workers: list[subprocess.Popen] = []
    with Watch(pg_server.admin_dsn, bouncer) as watch:
        # The model is not readable here: a benchmark run's is not checked, the fake engine needs none,
        # and the run records `auto`.
        run_cli(["submit", str(SAMPLE), "--run", "pooled", "--model", "/models/not-here", "--output", output,
                 "--batch-size", "8", "--max-tokens", "200", "--json", "--benchmark"], env)
        try:
            for i, log_path in enumerate(logs):
                with open(log_path, "wb") as log_file:
                    workers.append(subprocess.Popen(
                        [sys.executable, "-m", "worker.process.consumer", "--name", f"fake{i}@pooled",
                         # ~3 s per answer (31 tok/s per sequence): batches run long enough to heartbeat.
                         "--fake-engine", "tok_s=2000,seqs=64,mean=100,sigma=1",
                         # Heartbeats and reconciler passes many times within the run's seconds.
                         "--heartbeat-s", "0.5", "--reconcile-s", "1"],
                        env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True))
            final = wait_for(lambda: (s := status_json(env, "pooled"))["status"] == "finished" and s,
                             timeout_s=180, what="the pooled run finished", interval_s=1,
                             on_timeout=lambda: "\n".join(p.read_text()[-2000:] for p in logs))
            time.sleep(1)  # a last heartbeat or reconciler pass, watched
        finally:
            for proc in workers:
                proc.terminate()
            for proc in workers:
                proc.wait(timeout=90)

    assert watch.error is None, f"the watch failed: {watch.error!r}"
    worker_logs = "\n".join(p.read_text() for p in logs)
    pooler_log = bouncer.log_path.read_text()
    assert final["samples"]["done"] == SAMPLES and final["samples"]["failed"] == 0, final
    assert len({r["sample_id"] for r in output_rows(ObjectStore(), output)}) == SAMPLES
    # The pool held: Postgres never saw more than the compose's pool, though clients outnumbered it.
    assert 0 < watch.server_peak <= bouncer.pool_size, f"{watch.server_peak} server connections, pool {POOL}"
    assert watch.client_peak > bouncer.pool_size, f"only {watch.client_peak} clients: the pool was never short"
    # Every ledger path ran through it: claims and commits (each batch once, done), heartbeats, the reconciler.
    with psycopg.connect(bouncer.url, autocommit=True) as conn:
        statuses = conn.execute("SELECT status, min(attempts), max(attempts) FROM batches GROUP BY status").fetchall()
        passes = conn.execute("SELECT count(*) FROM reconciler_state WHERE last_pass_at IS NOT NULL").fetchone()[0]
    assert statuses == [("done", 1, 1)], statuses
    assert watch.heartbeats_seen > 0 and passes == 1, (watch.heartbeats_seen, passes)
    # Nothing failed for want of a prepared statement, nor for anything else the pooler refused.
    for text in (worker_logs, pooler_log):
        assert "prepared statement" not in text
        assert "unsupported startup parameter" not in text
    assert "Traceback" not in worker_logs, worker_logs[-3000:]


def test_the_tests_run_the_pgbouncer_release_the_compose_image_installs():
    binary = _binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("the pgbouncer binary is not installed - CI must provide it (.ci/run installs it)",
                        pytrace=False)
        pytest.skip("the pgbouncer binary is not installed (apt-get install pgbouncer)")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    tested = re.match(r"PgBouncer (\d+\.\d+)\.", version)
    pinned = re.search(r'"pgbouncer=(\d+\.\d+)\.\*"', (ROOT / "docker" / "pgbouncer.Dockerfile").read_text())
    assert tested and pinned, (version, pinned)
    assert tested[1] == pinned[1], f"the tests run PgBouncer {tested[1]}, the compose image installs {pinned[1]}"


def test_status_of_many_runs_twice_through_the_compose_pgbouncer(compose_bouncer, redis_url):
    # `regen status` reads with psycopg alone (ledger/reads.py), the same queries once per run: past
    # psycopg's prepare threshold (5) it would prepare them, and the next client handed that server
    # connection would find its statement names taken ("prepared statement _pg3_0 already exists").
    runs = 8
    with psycopg.connect(compose_bouncer.url, autocommit=True, prepare_threshold=None) as conn:
        for i in range(runs):
            conn.execute("INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
                         "VALUES (%s, 'm', '{}', 'h', 's3://b/x', 'regen', 4, 'active')", (f"r{i}",))
    env = {**os.environ, "DATABASE_URL": compose_bouncer.url, "REDIS_URL": redis_url, "REGEN_DB_POOLER": "transaction"}
    for _ in range(3):
        out = run_cli(["status", "--json"], env)
        assert len(json.loads(out.stdout)["runs"]) == runs
    assert "prepared statement" not in compose_bouncer.log_path.read_text()


def test_a_metrics_scrape_runs_through_the_compose_pgbouncer_with_its_statement_timeout(compose_bouncer, redis_url):
    settings = Settings(database_url=compose_bouncer.url, redis_url=redis_url, database_pooler="transaction")
    up = {m.name: m.samples[0].value for m in collect(settings) if m.name.endswith("_up")}
    assert up == {"regen_ledger_up": 1, "regen_broker_up": 1}  # before: refused at login, the ledger down
    engine = ledger_engine(settings)
    try:
        with engine.begin() as conn:  # each transaction of the exporter's, bounded: set in it, not at login
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == f"{STATEMENT_TIMEOUT_MS // 1000}s"
    finally:
        engine.dispose()
    with psycopg.connect(compose_bouncer.url, autocommit=True) as conn:  # and nothing left on the pooled connection
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "0"


def test_the_compose_healthcheck_passes_through_the_running_pgbouncer(compose_bouncer):
    psql = shutil.which("psql")
    if psql is None:
        msg = "psql is not installed here (the image installs postgresql-client for its healthcheck)"
        if os.environ.get("CI"):
            pytest.fail(msg + " - CI must provide it (.ci/run installs postgresql-client)", pytrace=False)
        pytest.skip(msg)
    healthcheck = load_compose(dummy_env())["services"]["pgbouncer"]["healthcheck"]["test"]
    assert healthcheck[0] == "CMD-SHELL"
    # The container's own environment, only the port moved to where this PgBouncer listens.
    port = urlsplit(compose_bouncer.url).port
    env = {**compose_pgbouncer_env(DB_NAME=compose_bouncer.database, DB_USER=urlsplit(compose_bouncer.url).username),
           "PATH": os.environ["PATH"]}
    command = healthcheck[1].replace("-p 6432", f"-p {port}")
    assert subprocess.run(["sh", "-c", command], env=env, timeout=30).returncode == 0
    wrong = {**env, "DB_PASSWORD": "not-the-password"}  # and it fails when the login does
    assert subprocess.run(["sh", "-c", command], env=wrong, timeout=30, capture_output=True).returncode != 0
