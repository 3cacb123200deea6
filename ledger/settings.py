"""One typed Settings object, built once at start from the environment and flags.

Nothing in regen reads ``os.environ`` at import time: commands build a Settings,
then pass it down. S3 is configured through boto3's own environment
(``AWS_ENDPOINT_URL``, credentials, region), so it has no field here beyond the
retry budget.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from ledger.defaults import DEFAULT_QUEUE_WINDOW
from ledger.errors import ConfigError

#: Used when neither a flag nor the environment names a database: the local
#: trust-auth Postgres of a development machine.
DEFAULT_DATABASE_URL = "postgresql://127.0.0.1:5432/regen"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: What ``REGEN_DB_POOLER`` may say: a PgBouncer in transaction mode, or nothing (a direct connection).
POOLERS = (None, "transaction")


def sqlalchemy_url(url: str) -> str:
    """Turn the standard ``postgresql://user@host:port/db`` form into a SQLAlchemy URL.

    regen uses psycopg 3 (binary wheels, COPY for bulk inserts). Users write the
    libpq form they already use with psql; the driver is our choice, not theirs.
    """
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    if url.startswith("postgresql+"):
        raise ConfigError(f"DATABASE_URL names a driver regen does not use ({url.split('://')[0]}); "
                          "write it as postgresql://user@host:port/db")
    raise ConfigError("DATABASE_URL must look like postgresql://user@host:port/db "
                      f"(got something starting with {url[:12]!r})")


def libpq_url(url: str) -> str:
    """The same database as :func:`sqlalchemy_url` names, in the ``postgresql://`` form psycopg connects to."""
    return "postgresql://" + sqlalchemy_url(url)[len("postgresql+psycopg://"):]


#: Query parameters that carry a secret: libpq's ``?password=`` (and ``sslpassword``), redis-py's ``?password=``.
_SECRET_PARAMETER = re.compile(r"([?&][^=&#]*pass(?:word|wd)?=)[^&#]*", re.IGNORECASE)


def redact(url: str) -> str:
    """A URL fit for logs: the password, if any, replaced by ***, in the user part or in a query parameter."""
    url = _SECRET_PARAMETER.sub(r"\1***", url)
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    # The user part ends at the last "@" before the path or query (a query may hold an "@" of its own).
    end = re.search(r"[/?#]", rest)
    authority, tail = (rest[:end.start()], rest[end.start():]) if end else (rest, "")
    if "@" not in authority:
        return url
    creds, host = authority.rsplit("@", 1)
    if ":" in creds:
        creds = creds.split(":", 1)[0] + ":***"
    return f"{scheme}://{creds}@{host}{tail}"


def _float_env(name: str) -> float | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError as e:
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}") from e


def _window_env(name: str) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return DEFAULT_QUEUE_WINDOW
    try:
        window = int(value)
    except ValueError as e:
        raise ConfigError(f"{name} must be a whole number of messages, got {value!r}") from e
    if window <= 0:
        raise ConfigError(f"{name} must be positive, got {window}")
    return window


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str = DEFAULT_REDIS_URL
    #: Attempts for one S3 call on transient errors (5xx, throttling, timeouts).
    s3_max_attempts: int = 8
    #: The broker's redelivery timeout; None = ledger/dispatch.py's default. Must be the
    #: same on every worker of a broker (the shortest wins). Tests shorten it.
    visibility_timeout_s: float | None = None
    #: Messages waiting per queue that submit and the reconciler keep the broker at
    #: (ledger/defaults.py DEFAULT_QUEUE_WINDOW; ``REGEN_QUEUE_WINDOW``).
    queue_window: int = DEFAULT_QUEUE_WINDOW
    #: ``transaction`` when ``database_url`` names a PgBouncer in transaction mode
    #: (``REGEN_DB_POOLER``): psycopg then prepares no statement (a prepared statement lives on
    #: one server connection; the next transaction may get another). None: a direct connection.
    database_pooler: str | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Environment first, then the non-None overrides (command-line flags)."""
        settings = cls(
            database_url=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL),
            redis_url=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
            visibility_timeout_s=_float_env("REGEN_VISIBILITY_TIMEOUT_S"),
            queue_window=_window_env("REGEN_QUEUE_WINDOW"),
            database_pooler=os.environ.get("REGEN_DB_POOLER") or None,
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(settings, **given) if given else settings

    def __post_init__(self) -> None:
        if self.database_pooler not in POOLERS:
            raise ConfigError(f"REGEN_DB_POOLER must be one of {sorted(p for p in POOLERS if p)} or unset, "
                              f"got {self.database_pooler!r}")

    @property
    def sqlalchemy_url(self) -> str:
        return sqlalchemy_url(self.database_url)

    @property
    def libpq_url(self) -> str:
        """For a plain psycopg connection (ledger/reads.py): validated as ``sqlalchemy_url`` is."""
        return libpq_url(self.database_url)
