"""pytest plugin: a fresh Postgres database and a Redis database for this test session.

Skips a service test locally when the service is down, but fails it under CI
(``CI`` set), so a broken CI machine is never green by skipping everything.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import redis as redis_lib
from sqlalchemy import text

from ledger import migrate
from ledger.db import make_engine, make_sessionmaker
from ledger.settings import Settings

ADMIN_DSN = os.environ.get("REGEN_TEST_PG", "postgresql://127.0.0.1:5432/test")
#: A Redis database of its own, flushed per test, so the developer's db 0 is untouched. Chosen per
#: test session (1-15), so two sessions on one machine (CI and a developer) rarely share one.
REDIS_URL = os.environ.get("REGEN_TEST_REDIS", f"redis://127.0.0.1:6379/{1 + os.getpid() % 15}")


def _unavailable(what: str, error: Exception):
    msg = f"{what} is not reachable ({error})"
    if os.environ.get("CI"):
        pytest.fail(msg + " - CI must provide it", pytrace=False)
    pytest.skip(msg)


def _base(dsn: str) -> str:
    return dsn.rsplit("/", 1)[0]


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh database with the ledger migrated, dropped at the end of the session."""
    name = f"regen_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        _unavailable("Postgres at " + ADMIN_DSN, e)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{_base(ADMIN_DSN)}/{name}"
    migrate.upgrade(Settings(database_url=url))
    try:
        yield url
    finally:
        # A new connection: a fault test may have restarted Postgres since.
        with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=30) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(pg_database: str) -> Iterator[str]:
    """The session database, emptied before the test."""
    engine = make_engine(Settings(database_url=pg_database))
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE runs, batches, samples, rejected_rows RESTART IDENTITY CASCADE"))
    engine.dispose()
    yield pg_database


@pytest.fixture
def redis_url() -> Iterator[str]:
    client = redis_lib.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis_lib.RedisError as e:
        _unavailable("Redis at " + REDIS_URL, e)
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()


@pytest.fixture
def settings(database_url: str, redis_url: str) -> Settings:
    return Settings(database_url=database_url, redis_url=redis_url, s3_max_attempts=4)


@pytest.fixture
def sessions(settings: Settings):
    engine = make_engine(settings)
    yield make_sessionmaker(engine)
    engine.dispose()
