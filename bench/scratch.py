"""Throw-away services for a benchmark: a moto S3 server, a scratch Postgres database, a Redis queue.

Everything a benchmark creates is named uniquely and removed at the end (the
database is dropped, the queue deleted, moto stopped), so benchmarks run beside
other people's tests and workers on the same Postgres and Redis.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import redis as redis_lib

from ledger import migrate
from ledger.settings import Settings
from local.s3 import start_local_s3
from local.services import with_database

#: An existing database to connect to for CREATE/DROP DATABASE (the tests use the same).
DEFAULT_ADMIN_DSN = "postgresql://127.0.0.1:5432/test"
#: Redis db 0 with a queue of its own (deleted at the end): the test fixtures take dbs 1-15 and
#: FLUSHDB them, which would silently drop a benchmark's messages half way.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: Twice the tests' wait for moto: benchmarks start it on a machine their engines already load.
MOTO_START_TIMEOUT_S = 60.0


@dataclass
class Scratch:
    settings: Settings
    s3_env: dict[str, str]
    bucket: str
    #: The benchmark's queue; queues named ``<queue>-<suffix>`` are removed at the end too.
    queue: str
    database_name: str
    #: A temporary folder for the benchmark's files (datasets, worker logs), removed at the end.
    workdir: str
    moto: subprocess.Popen = field(repr=False)

    @property
    def output_root(self) -> str:
        return f"s3://{self.bucket}"

    def env(self) -> dict[str, str]:
        """The environment of a process (worker, CLI) that should use these services."""
        return {**os.environ, **self.s3_env, "DATABASE_URL": self.settings.database_url,
                "REDIS_URL": self.settings.redis_url}


@contextlib.contextmanager
def scratch_services(*, admin_dsn: str = DEFAULT_ADMIN_DSN, redis_url: str = DEFAULT_REDIS_URL,
                     prefix: str = "regen_bench") -> Iterator[Scratch]:
    """Start moto, create and migrate a database, pick a queue; undo all of it on exit.

    This process's boto3 is pointed at moto through the environment (as ObjectStore
    expects); the variables are restored on exit.
    """
    tag = uuid.uuid4().hex[:8]
    workdir = tempfile.mkdtemp(prefix=f"regen-bench-{tag}-")
    local_s3 = start_local_s3(log_path=os.path.join(workdir, "moto.log"), start_timeout_s=MOTO_START_TIMEOUT_S)
    moto = local_s3.process
    s3_env = local_s3.env()
    saved = {k: os.environ.get(k) for k in s3_env}
    os.environ.update(s3_env)
    admin = psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5)
    name = f"{prefix}_{tag}"
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        settings = Settings(database_url=with_database(admin_dsn, name), redis_url=redis_url)
        migrate.upgrade(settings)
        bucket = f"regen-bench-{tag}"
        import boto3

        boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
        yield Scratch(settings=settings, s3_env=s3_env, bucket=bucket, queue=f"bench-{tag}",
                      database_name=name, workdir=workdir, moto=moto)
    finally:
        # Each step on its own: a Postgres restarted by someone else must not leave moto running.
        with contextlib.suppress(redis_lib.RedisError):
            client = redis_lib.Redis.from_url(redis_url)
            # The queue, queues derived from it (bench-<tag>-b-k8) and kombu's bindings of them.
            for pattern in (f"bench-{tag}*", f"_kombu.binding*.bench-{tag}*"):
                keys = list(client.scan_iter(match=pattern, count=1000))
                if keys:
                    client.delete(*keys)
            client.close()
        local_s3.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _drop_database(admin, admin_dsn, name)


def _drop_database(admin: psycopg.Connection, admin_dsn: str, name: str) -> None:
    for _ in range(60):
        try:
            if admin.closed or admin.broken:
                admin = psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5)
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.close()
            return
        except psycopg.OperationalError:
            time.sleep(2)  # Postgres restarting
    print(f"warning: could not drop the scratch database {name}; drop it by hand", file=sys.stderr)
