"""A ``regen metrics`` scrape at 1M, 10M and 100M samples: the query set before migration 0015 against this one.

    python -m bench.metrics_scale --samples 1000000 10000000 100000000 --before a1698bc

Per size, a scratch database at migration 0014 holds one run of ``samples / 64`` batches, as a
1,000-GPU farm leaves it half-way (bench/metrics_scale_ledger.sql): half done (1 in 50 failed once
on its way), 0.1% dead, up to 20,000 running and 10,000 queued (100 of them last refused by
another model's worker, 10 refused by a fake engine), the rest planned; rejected rows for 1% of
the input; the samples' counts in ``run_sample_counts`` (no sample row is read by either side).
It is vacuumed as autovacuum leaves a ledger, then ``regen db upgrade`` to 0015 runs while
probes write beside it (a heartbeat, a run's row, a rejected row): the upgrade's time and each
probe's longest wait.

Then each side in a child process of its own, against the same ledger: ``--before``'s
``ledger``/``producer`` (git archive) first on ``PYTHONPATH``, then this tree. A child builds
the exporter's collector (connections kept, as ``regen metrics`` does), scrapes ``--repeat``
times (median and fastest ms, each a whole scrape: ledger and Redis), reads its own peak RSS,
and re-runs one scrape's statements under EXPLAIN (ANALYZE, BUFFERS): shared buffers and rows
read per table. The scratch database is dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Read only (LLEN, HLEN): the exporter's broker figures, on the machine's Redis.
REDIS_URL = "redis://127.0.0.1:6379/0"
#: A synthetic ledger written directly, apart from regen's code (tests/unit/test_transitions.py
#: scans the .py files for status writes).
FILL_SQL = Path(__file__).with_name("metrics_scale_ledger.sql")
SAMPLES_PER_BATCH = 64


@dataclass(frozen=True)
class LedgerShape:
    """One run's batches by what happened to them, and its rejected rows."""

    done: int
    dead: int
    running: int
    queued: int
    planned: int
    #: Queued batches last refused by a worker of another model; queued ones a fake engine refused.
    refused: int
    fake_refused: int
    rejected: int

    @property
    def batches(self) -> int:
        return self.done + self.dead + self.running + self.queued + self.planned

    @classmethod
    def of_samples(cls, samples: int) -> LedgerShape:
        """Half-way through a run on a 1,000-GPU farm (its running and queue window), 1% of rows rejected."""
        batches = samples // SAMPLES_PER_BATCH
        done, dead = batches // 2, batches // 1000
        running, queued = min(20_000, batches // 10), min(10_000, batches // 10)
        return cls(done=done, dead=dead, running=running, queued=queued,
                   planned=batches - done - dead - running - queued, refused=min(100, queued),
                   fake_refused=min(10, queued), rejected=samples // 100)


def fill_ledger(conn, shape: LedgerShape) -> int:
    """Write ``shape``'s run with a SQLAlchemy Connection or Session; its id."""
    from sqlalchemy import text

    run_sql, *statements = FILL_SQL.read_text().split(";\n")
    run_id = conn.execute(text(run_sql)).scalar_one()
    params = {**asdict(shape), "run": run_id, "n": shape.batches,
              "failed": shape.done * SAMPLES_PER_BATCH // 1000}
    for sql in statements:
        conn.execute(text(sql), {k: v for k, v in params.items() if f":{k}" in sql})
    return run_id


# --- the child: one side's scrapes ---------------------------------------------------------------------


def _child(args) -> dict:
    import psycopg

    from bench.plan_reads import caught_statements, plans_of
    from ledger.settings import Settings
    from producer.monitoring.metrics import RegenCollector

    settings = Settings(database_url=args.database_url, redis_url=args.redis_url)
    collector = RegenCollector(settings)
    rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def scrape() -> bool:
        families = list(collector.collect())
        return next(f for f in families if f.name == "regen_ledger_up").samples[0].value == 1

    t = time.perf_counter()
    up = [scrape()]
    first_ms = (time.perf_counter() - t) * 1000
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        up.append(scrape())
        times.append((time.perf_counter() - t) * 1000)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with caught_statements(collector.db) as caught:
        scrape()
    collector.close()
    with psycopg.connect(settings.libpq_url) as conn:
        plans, rows = plans_of(conn, caught)
    buffers = sum(reads.buffers for reads in plans)
    statements = [{"ms": reads.execution_ms, "buffers": reads.buffers, "scans": reads.scans,
                   "sql": " ".join(reads.sql.split())[:90]} for reads in plans]
    return {"first_ms": first_ms, "median_ms": statistics.median(times), "fastest_ms": min(times),
            "ledger_up": all(up), "rss_mb": rss_kb / 1024, "rss_growth_mb": (rss_kb - rss_before_kb) / 1024,
            "buffers": buffers, "rows": rows, "statements": statements}


def _side(code_root: str, database_url: str, args) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([code_root, str(ROOT)])}
    argv = [sys.executable, "-m", "bench.metrics_scale", "--child", "--database-url", database_url,
            "--redis-url", args.redis_url, "--repeat", str(args.repeat)]
    done = subprocess.run(argv, env=env, cwd=code_root, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the {code_root} side failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the parent: the ledger, the upgrade, both sides -----------------------------------------------------

#: Writes a live farm makes while the upgrade runs; {running}: a running batch's id, {run}: the run's.
PROBES = {
    "heartbeat (UPDATE a running batch)": "UPDATE batches SET heartbeat_at = now() WHERE id = {running}",
    "a run's row (UPDATE runs)": "UPDATE runs SET gate_checked_at = now() WHERE id = {run}",
    "a rejected row (INSERT, rolled back)": "INSERT INTO rejected_rows (run_id, source_file, source_row, reason, "
                                            "detail) VALUES ({run}, 'probe.jsonl', 1, 'malformed_json', 'probe')",
}


def _upgrade_under_probes(settings, run_id: int, running_id: int) -> tuple[float, dict[str, float]]:
    from bench.migration_locks import upgrade_beside_probes

    upgrade_s, waits = upgrade_beside_probes(
        settings, {label: sql.format(run=run_id, running=running_id) for label, sql in PROBES.items()})
    return upgrade_s, {label: max(w) * 1000 for label, w in waits.items()}


def _measure(samples: int, before_root: str | None, args) -> dict:
    import psycopg

    from ledger import migrate
    from ledger.db import make_engine
    from ledger.settings import Settings
    from local.services import with_database

    shape = LedgerShape.of_samples(samples)
    name = f"regen_metrics_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    settings = Settings(database_url=with_database(args.admin_dsn, name), redis_url=args.redis_url)
    try:
        migrate.upgrade(settings, "0014")
        t0 = time.perf_counter()
        engine = make_engine(settings)
        with engine.begin() as conn:
            run_id = fill_ledger(conn, shape)
        engine.dispose()
        with psycopg.connect(settings.libpq_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            running_id = conn.execute("SELECT min(id) FROM batches WHERE status = 'running'").fetchone()[0]
            sizes = conn.execute("SELECT pg_total_relation_size('batches'), "
                                 "pg_total_relation_size('rejected_rows')").fetchone()
        fill_s = time.perf_counter() - t0
        upgrade_s, waits = _upgrade_under_probes(settings, run_id, running_id)
        with psycopg.connect(settings.libpq_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE batches")  # the new index's statistics, as autovacuum would
        sides = {}
        if before_root:
            sides["before"] = _side(before_root, settings.database_url, args)
        sides["after"] = _side(str(ROOT), settings.database_url, args)
        return {"samples": samples, "shape": asdict(shape), "fill_s": fill_s, "batches_mb": sizes[0] / 2**20,
                "rejected_mb": sizes[1] / 2**20, "upgrade_s": upgrade_s, "waits_ms": waits, "sides": sides}
    finally:
        with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _ratio(before: float, after: float) -> str:
    return f"{before / after:8.1f}x" if after else "       -"


def _report(m: dict, before: str | None) -> None:
    s = m["shape"]
    print(f"\n## {m['samples']:,} samples: {sum(v for k, v in s.items() if k not in ('refused', 'fake_refused', 'rejected')):,} "
          f"batches ({s['done']:,} done, {s['dead']:,} dead, {s['running']:,} running, {s['queued']:,} queued, "
          f"{s['planned']:,} planned), {s['rejected']:,} rejected rows; batches {m['batches_mb']:,.0f} MB, "
          f"rejected_rows {m['rejected_mb']:,.0f} MB (written and vacuumed in {m['fill_s']:.0f} s)")
    print(f"regen db upgrade 0014 -> 0015: {m['upgrade_s']:.2f} s; longest wait of a write beside it: "
          + ", ".join(f"{label} {ms:,.0f} ms" for label, ms in m["waits_ms"].items()))
    sides = m["sides"]
    names = list(sides)
    head = "".join(f"{(n + ' (' + before + ')' if n == 'before' and before else n):>22}" for n in names)
    print(f"{'':44}{head}{'before/after' if len(names) == 2 else '':>14}")
    rows = [("scrape, median of the repeats (ms)", "median_ms", "{:22.1f}"),
            ("scrape, fastest (ms)", "fastest_ms", "{:22.1f}"),
            ("first scrape, connecting (ms)", "first_ms", "{:22.1f}"),
            ("shared buffers read per scrape (EXPLAIN)", "buffers", "{:22,.0f}"),
            ("exporter peak RSS (MB)", "rss_mb", "{:22.1f}"),
            ("  of which grown over the scrapes (MB)", "rss_growth_mb", "{:22.1f}")]
    for label, key, fmt in rows:
        cells = "".join(fmt.format(sides[n][key]) for n in names)
        ratio = _ratio(sides["before"][key], sides["after"][key]) if len(names) == 2 and "rss" not in key else ""
        print(f"{label:44}{cells}{ratio:>14}")
    for table in ("batches", "rejected_rows"):
        cells = "".join(f"{sides[n]['rows'].get(table, 0):22,.0f}" for n in names)
        print(f"{'rows read from ' + table + ' (EXPLAIN)':44}{cells}")
    print(f"{'every scrape answered (ledger_up)':44}" + "".join(f"{str(sides[n]['ledger_up']):>22}" for n in names))
    for n in names:
        print(f"statements ({n}):")
        for st in sides[n]["statements"]:
            print(f"  {st['ms']:9.1f} ms {st['buffers']:8,} buf  {'; '.join(st['scans']) or '-':60.60}  {st['sql']}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--before", default=None, help="git revision whose exporter to compare with (its ledger and "
                   "producer packages; this tree's migrations build the ledger)")
    p.add_argument("--admin-dsn", default=ADMIN)
    p.add_argument("--redis-url", default=REDIS_URL)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--database-url", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    print(f"# python -m bench.metrics_scale --samples {' '.join(map(str, args.samples))} --repeat {args.repeat}"
          + (f" --before {args.before}" if args.before else "")
          + f"   ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})")
    with tempfile.TemporaryDirectory(prefix="regen-before-") as root:
        before_root = None
        if args.before:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", args.before, "ledger",
                                      "producer"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
            (Path(root) / "bench").symlink_to(ROOT / "bench")
            before_root = root
        for samples in args.samples:
            m = _measure(samples, before_root, args)
            _report(m, args.before)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
