"""Ledger, broker and object-store failures of any ``regen`` command, said in one line.

A command run against a Postgres that is down, missing or not migrated, a Redis that does not
answer, or an S3 endpoint without credentials used to end in a psycopg/SQLAlchemy/kombu
traceback ("relation \"runs\" does not exist"). ``describe`` turns each into one line that
names the address (password redacted) and the fix; ``regen --debug`` keeps the traceback.
Anything it does not recognise is left alone: a bug keeps its traceback.
"""

from __future__ import annotations

import os

from ledger.errors import StoreError
from ledger.settings import Settings, redact

#: Store errors about the objects themselves, not the way to the store: said as they are.
_NOT_CONFIG_CODES = frozenset({"ChecksumMismatch", "PreconditionFailed"})


def describe(exc: BaseException, settings: Settings | None) -> str | None:
    """One line for an infrastructure error (without the ``error:`` prefix), or None if it is not one."""
    settings = settings or Settings.from_env()
    for e in _chain(exc):
        line = _ledger(e, settings) or _broker(e, settings) or _store(e)
        if line is not None:
            return line
    return None


def _chain(exc: BaseException):
    """The exception and what it was raised from (SQLAlchemy wraps psycopg's, kombu wraps redis-py's)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e).strip()
    return (text.splitlines() or [type(e).__name__])[0][:200]


def _ledger(e: BaseException, settings: Settings) -> str | None:
    import psycopg
    from sqlalchemy import exc as sa

    where = redact(settings.database_url)
    orig = getattr(e, "orig", None) or e
    if isinstance(orig, (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)):
        return (f"the ledger at {where} is not migrated to this regen ({_first_line(orig)}): "
                "run `regen db upgrade`")
    if isinstance(orig, psycopg.errors.InvalidCatalogName):
        return (f"the ledger's database at {where} does not exist ({_first_line(orig)}): create it "
                "(createdb), then run `regen db upgrade`")
    if isinstance(e, (sa.OperationalError, psycopg.OperationalError)):
        return (f"cannot reach the ledger at {where} ({_first_line(e)}): check DATABASE_URL (or --database-url) "
                "and that Postgres runs")
    return None


def _broker(e: BaseException, settings: Settings) -> str | None:
    import redis
    from kombu.exceptions import OperationalError as KombuOperationalError

    if isinstance(e, (redis.ConnectionError, redis.TimeoutError, KombuOperationalError)):
        return (f"cannot reach the broker at {redact(settings.redis_url)} ({_first_line(e)}): check REDIS_URL "
                "(or --redis-url) and that Redis runs")
    return None


def _store(e: BaseException) -> str | None:
    from botocore.exceptions import BotoCoreError, ClientError

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3 (no endpoint set)"
    fix = ("check AWS_ENDPOINT_URL, the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and "
           "that the bucket exists")
    if isinstance(e, StoreError) and e.code not in _NOT_CONFIG_CODES:
        return f"{e} (S3 at {endpoint}): {fix}"
    if isinstance(e, (BotoCoreError, ClientError)):
        return f"S3 at {endpoint}: {type(e).__name__}: {_first_line(e)}: {fix}"
    return None
