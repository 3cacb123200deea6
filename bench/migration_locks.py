"""How long migration 0011 (counters sharded by batch) holds the ledger's locks on a big ledger.

    python -m bench.migration_locks --batches 1562500      # a 100M-sample run's batches

A scratch database at migration 0010 holds one run of ``--batches`` batches (bench/reconcile_scale.py's
synthetic ledger: half done, 20,000 running, 17,000 queued, the rest planned; 100,000 failed sample
rows), vacuumed as autovacuum leaves it. Then ``regen db upgrade`` to 0011 while three probes run
every 50 ms, each on a connection of its own, as a live farm's do: a heartbeat (an UPDATE of one
running batch), a status read (``regen status``'s batch counts) and a claim-like read of the run's
row. Printed: the upgrade's seconds and, per probe, its longest wait. The scratch database is dropped.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from pathlib import Path

import psycopg
from sqlalchemy import text

from ledger import migrate
from ledger.db import make_engine
from ledger.settings import Settings

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
FILL_SQL = Path(__file__).with_name("reconcile_scale_ledger.sql")

PROBES = {
    # The first running batch (reconcile_scale_ledger.sql's seq order: done, then running).
    "heartbeat (UPDATE one running batch)": "UPDATE batches SET heartbeat_at = now() WHERE id = {running}",
    "status read (the run's batches by status)":
        "SELECT status, count(*) FROM batches WHERE run_id = 1 AND status IN ('queued', 'running') GROUP BY 1",
    "read of the run's row": "SELECT name, status FROM runs WHERE id = 1",
}


def _probe(url: str, sql: str, stop: threading.Event, waits: list[float]) -> None:
    with psycopg.connect(url) as conn:
        while not stop.is_set():
            t = time.perf_counter()
            conn.execute(sql)
            conn.rollback()  # a write probe keeps nothing: the ledger measured after is the one written
            waits.append(time.perf_counter() - t)
            time.sleep(0.05)


def upgrade_beside_probes(settings: Settings, probes: dict[str, str], revision: str = "head"
                          ) -> tuple[float, dict[str, list[float]]]:
    """``regen db upgrade`` to ``revision`` while each probe runs every 50 ms on a connection of its own
    (from a second before to a second after): the upgrade's seconds, and each probe's waits (s)."""
    stop = threading.Event()
    waits: dict[str, list[float]] = {label: [] for label in probes}
    threads = [threading.Thread(target=_probe, args=(settings.libpq_url, sql, stop, waits[label]))
               for label, sql in probes.items()]
    for thread in threads:
        thread.start()
    time.sleep(1)
    started = time.perf_counter()
    try:
        migrate.upgrade(settings, revision)
    finally:
        upgrade_s = time.perf_counter() - started
        time.sleep(1)
        stop.set()
        for thread in threads:
            thread.join()
    return upgrade_s, waits


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=1_562_500)
    p.add_argument("--admin-dsn", default=ADMIN)
    args = p.parse_args()
    name = f"regen_migration_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    settings = Settings(database_url=args.admin_dsn.rsplit("/", 1)[0] + f"/{name}")
    try:
        migrate.upgrade(settings, "0010")
        run_sql, batches_sql, samples_sql, _counts_0011 = FILL_SQL.read_text().split(";\n")
        t0 = time.perf_counter()
        engine = make_engine(settings)
        with engine.begin() as conn:
            run = conn.execute(text(run_sql), {"queue": "q"}).scalar()
            conn.execute(text(batches_sql), {"run": run, "done": args.batches // 2, "running": 20_000,
                                             "queued": 17_000, "n": args.batches})
            conn.execute(text(samples_sql), {"run": run, "failed": 100_000, "done": args.batches // 2})
        engine.dispose()
        with psycopg.connect(settings.libpq_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        print(f"ledger at 0010: {args.batches:,} batches written and vacuumed in {time.perf_counter() - t0:.0f} s")
        running = args.batches // 2 + 1  # ids count from 1 in a fresh database, in seq order
        upgrade_s, waits = upgrade_beside_probes(
            settings, {label: sql.format(running=running) for label, sql in PROBES.items()}, "0011")
        print(f"regen db upgrade 0010 -> 0011: {upgrade_s:.2f} s")
        for label, w in waits.items():
            print(f"  {label}: longest {max(w) * 1000:,.0f} ms over {len(w)} probes")
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
