"""Read queries that run alike on a plain psycopg connection and on a SQLAlchemy Session or Connection.

``regen status`` is a short-lived process whose queries take ~50 ms on a 914K-sample
ledger, while importing SQLAlchemy takes ~0.2 s: it connects with psycopg alone
(``connect``). Workers, the exporter, ``--watch``, the tests and the benchmarks hold
SQLAlchemy sessions and call the same functions: each query is written once, in
psycopg's ``%(name)s`` style, and given a SQLAlchemy object it runs through
``exec_driver_sql``, so SQLAlchemy still wraps a lost connection as its
OperationalError (``ledger.db.retry_db`` retries on it) and invalidates it in the pool.
Either way the rows hold the driver's own values, as a ``text()`` query's do.

Nothing here imports SQLAlchemy.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from ledger.settings import Settings


def connect(settings: Settings) -> psycopg.Connection:
    """A psycopg connection to the ledger, for a command that only reads (closed by ``with``)."""
    if settings.database_pooler == "transaction":
        # As ledger/db.py: status runs its queries once per run, so past psycopg's threshold (5)
        # it would prepare them, and leave them on a pooled server connection whose next client
        # prepares the same names ("prepared statement _pg3_0 already exists").
        return psycopg.connect(settings.libpq_url, prepare_threshold=None)
    return psycopg.connect(settings.libpq_url)


def fetch_rows(conn: Any, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
    """Every row of a query, as tuples. ``conn``: a psycopg connection, a SQLAlchemy Session or Connection."""
    if isinstance(conn, psycopg.Connection):
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()
    return [tuple(row) for row in _sqlalchemy_connection(conn).exec_driver_sql(sql, params or {})]


def fetch_dicts(conn: Any, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every row of a query, as dicts keyed by column name."""
    if isinstance(conn, psycopg.Connection):
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(sql, params)
            return cur.fetchall()
    return [dict(row) for row in _sqlalchemy_connection(conn).exec_driver_sql(sql, params or {}).mappings()]


def _sqlalchemy_connection(conn: Any) -> Any:
    """A Session's Connection (in the session's transaction), or the Connection itself."""
    return conn.connection() if hasattr(conn, "get_bind") else conn
