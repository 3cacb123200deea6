"""``regen worker``'s start: wait a bounded, printed time for the ledger and the broker, then give up.

A worker started with no reachable Postgres or Redis used to say "could not check the ledger's
migration ...; starting anyway" and then let Celery retry its broker every 10 s, 100 times (16
minutes), naming it ``redis://:**@...`` whether or not it had a password. A node may well boot
while Postgres or Redis restarts, so the worker does wait, but it says for what, where, and how
long, and exits non-zero once that time is spent: a supervisor (systemd, SLURM) then sees a
failure instead of a process that looks alive.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ledger.errors import ConfigError
from ledger.settings import Settings, redact

#: How long ``regen worker`` waits for the ledger and the broker by default: long enough for a
#: Postgres or Redis restart (seconds to a minute), short enough that a wrong URL is told within minutes.
DEFAULT_SERVICES_WAIT_S = 120.0
#: Seconds between two tries, and the connect timeout of each: a host that drops packets costs one try.
RETRY_EVERY_S = 5.0


class ServicesUnreachable(ConfigError):
    """The ledger or the broker did not answer within the wait."""


def ledger_problem(settings: Settings) -> str | None:
    """Why the ledger cannot be reached (None when it answers)."""
    import psycopg

    try:
        with psycopg.connect(settings.libpq_url, connect_timeout=max(1, int(RETRY_EVERY_S))) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as e:
        return f"the ledger at {redact(settings.database_url)} ({_first_line(e)})"
    return None


def broker_problem(settings: Settings) -> str | None:
    """Why the broker cannot be reached (None when it answers a PING)."""
    import redis

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=RETRY_EVERY_S,
                                  socket_connect_timeout=RETRY_EVERY_S)
    try:
        client.ping()
    except redis.RedisError as e:
        return f"the broker at {redact(settings.redis_url)} ({_first_line(e)})"
    finally:
        client.close()
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines() or [type(e).__name__])[0][:160]


def wait_for_services(settings: Settings, wait_s: float, say: Callable[[str], None], *,
                      check_ledger: Callable[[], None] = lambda: None,
                      clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once the ledger and the broker both answer; raise after ``wait_s`` seconds if they do not.

    ``say`` gets one line when the wait starts (what is down, where, for how long) and one when it ends well.
    ``check_ledger`` runs once, as soon as the ledger answers (the worker's migration check): a
    refusal of the ledger itself need not wait for the broker.

    Raises:
        ServicesUnreachable: after ``wait_s``, naming what still does not answer, where, and the fix.
        ConfigError: from ``check_ledger``.
    """
    deadline = clock() + wait_s
    waited = checked = False
    while True:
        ledger = ledger_problem(settings)
        if ledger is None and not checked:
            check_ledger()
            checked = True
        problems = [p for p in (ledger, broker_problem(settings)) if p]
        if not problems:
            if waited:
                say("the ledger and the broker answer: starting")
            return
        if clock() >= deadline:
            raise ServicesUnreachable(
                f"cannot reach {' nor '.join(problems)} after {wait_s:.0f} s: check DATABASE_URL and REDIS_URL "
                "and that Postgres and Redis run; --services-wait-s sets the wait")
        if not waited:
            say(f"cannot reach {' nor '.join(problems)}: waiting up to {wait_s:.0f} s (--services-wait-s)")
            waited = True
        sleep(min(RETRY_EVERY_S, max(0.0, deadline - clock())))
