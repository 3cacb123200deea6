"""A reconciler pass, a submit-side top-up and ``regen status``'s broker figures on a large ledger.

The ledger holds one run of ``--batches`` batches (1,562,500 of 64: a 100M-sample run; no
sample rows, which no query here reads), most ``planned``, a window ``queued`` on Redis,
some ``running`` and the rest ``done``; Redis holds the window's messages. It prints each
pass's time, what it did, and Redis memory. Scratch database and Redis db 15, dropped at the end.

    python -m bench.reconcile_scale --batches 1562500
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path

import psycopg
import redis as redis_lib
from sqlalchemy import text

from ledger import migrate
from ledger.db import make_engine, make_sessionmaker
from ledger.dispatch import make_celery
from ledger.reconcile import reconcile_once
from ledger.settings import Settings
from producer.monitoring.status import broker_figures

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


#: A synthetic ledger state written directly (no worker could build 1.5M batches' history in a
#: benchmark's time): kept in a .sql file, apart from regen's code, whose status writes all go
#: through ledger/transitions.py (tests/unit/test_transitions.py scans the .py files).
FILL_SQL = Path(__file__).with_name("reconcile_scale_ledger.sql")


def _fill(sessions, n: int, *, window: int, running: int, done_share: float) -> int:
    done = int(n * done_share)
    run_sql, batches_sql = FILL_SQL.read_text().split(";\n", 1)
    with sessions.begin() as s:
        run_id = s.execute(text(run_sql)).scalar()
        # seq order: done, then running, then the queued window, then planned.
        s.execute(text(batches_sql), {"run": run_id, "done": done, "running": running, "window": window, "n": n})
    with sessions.begin() as s:
        s.execute(text("ANALYZE batches"))
    return run_id


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=1_562_500)
    p.add_argument("--window", type=int, default=10_000)
    p.add_argument("--running", type=int, default=20_000)
    p.add_argument("--passes", type=int, default=5)
    args = p.parse_args()
    name = f"regen_reconcile_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    settings = Settings(database_url=f"postgresql://postgres@127.0.0.1:5432/{name}",
                        redis_url="redis://127.0.0.1:6379/15")
    r = redis_lib.Redis.from_url(settings.redis_url)
    r.flushdb()
    try:
        migrate.upgrade(settings)
        engine = make_engine(settings)
        sessions = make_sessionmaker(engine)
        app = make_celery(settings)
        t0 = time.perf_counter()
        run_id = _fill(sessions, args.batches, window=args.window, running=args.running, done_share=0.5)
        print(f"ledger: {args.batches:,} batches ({args.batches * 64:,} samples' worth) written in "
              f"{time.perf_counter() - t0:.0f} s; {args.running:,} running, {args.window:,} queued, half done")
        # The first pass finds the window's messages missing (an empty Redis) and republishes them.
        times = []
        for i in range(args.passes + 1):
            t = time.perf_counter()
            report = reconcile_once(sessions, app, lease_s=30, max_attempts=3, window=args.window)
            times.append(time.perf_counter() - t)
            print(f"pass {i}: {times[-1] * 1000:.0f} ms: expired {report.expired}, republished {report.republished} "
                  f"(lost {report.lost}), topped up {report.topped_up}; queue {r.llen('regen'):,}")
            if i == 0:
                print(f"redis: {r.info('memory')['used_memory'] / 2**20:.1f} MB used, "
                      f"{r.memory_usage('regen') / 2**20:.1f} MB for the queue")
        steady = times[1:]
        print(f"steady passes (window full, {args.window:,} queued older than the grace period, all waiting): "
              f"median {statistics.median(steady) * 1000:.0f} ms, max {max(steady) * 1000:.0f} ms")
        # Workers drain 1,000 messages: the next pass tops up 1,000.
        for _ in range(1000):
            r.rpop("regen")
        t = time.perf_counter()
        report = reconcile_once(sessions, app, lease_s=30, max_attempts=3, window=args.window)
        print(f"after 1,000 consumed: pass {(time.perf_counter() - t) * 1000:.0f} ms, topped up {report.topped_up}")
        # Every queued batch past the grace period and waiting on the queue: the pass reads the whole queue.
        with sessions.begin() as s:
            s.execute(text("UPDATE batches SET enqueued_at = enqueued_at - interval '2 hours' WHERE status = 'queued'"))
        t = time.perf_counter()
        report = reconcile_once(sessions, app, lease_s=30, max_attempts=3, window=args.window)
        print(f"every queued batch past its grace period, all {r.llen('regen'):,} waiting: pass "
              f"{(time.perf_counter() - t) * 1000:.0f} ms, republished {report.republished}")
        with sessions() as s:
            t = time.perf_counter()
            figures = broker_figures(s, run_id, "regen", settings.redis_url)
            print(f"status broker figures: {(time.perf_counter() - t) * 1000:.0f} ms ({figures})")
        engine.dispose()
    finally:
        r.flushdb()
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
