"""The four reads of issue 22's goal on a 100M-sample ledger, before and after, side by side.

    python -m bench.reconcile_scale --batches 1562500 --before main

One scratch database holds one run of ``--batches`` batches of 64 (1,562,500: 100M samples):
half ``done`` (tokens and times as a 1,000-GPU farm leaves them, the last 94K within the
status's 15-minute window), ``--running`` running, ``--queued`` queued (published in seq
order, their messages waiting on a queue of its own on Redis) and the rest ``planned``;
``run_sample_counts`` holds the 100M samples' counts. Of ``samples`` it holds the failed
ones only (``--failed``): the one sample read of the four (status's failure reasons) reads
those alone through ``samples_run_status_idx``, and the EXPLAIN printed below shows it; the
gate and status's other sample figures read ``run_sample_counts``.

Each side runs in a child process of its own against the same ledger and queue: ``--before``
with that git revision's ``ledger``/``producer`` first on ``PYTHONPATH``, then this tree. Each
times (median of ``--repeat``, ms):

- the finish check: ``transitions.finish_run_if_drained`` as a commit runs it;
- a gate pass: ``quality.enforce_gate`` when it is due (the claim, the count, the judgement);
- reconciler passes (``reconcile.reconcile_once``): steady (the window full, nothing past its
  grace period), every queued batch past its grace period and waiting (a small farm's queue),
  and the same with one message lost in the middle of the queue;
- ``regen status --run big`` and ``--json``: the CLI command in this process (its connect,
  queries, Redis reads and output; not Python's start-up, printed apart).

Then this tree's status statements one by one (EXPLAIN ANALYZE), and the scratch database and
queue are dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Redis db 0 with a queue of its own, deleted at the end (the tests flush dbs 1-15).
REDIS_URL = "redis://127.0.0.1:6379/0"
GOAL_MS = 100.0

#: A synthetic ledger state written directly (no worker could build 1.5M batches' history in a
#: benchmark's time): kept in a .sql file, apart from regen's code, whose status writes all go
#: through ledger/transitions.py (tests/unit/test_transitions.py scans the .py files).
FILL_SQL = Path(__file__).with_name("reconcile_scale_ledger.sql")

ROWS = [
    ("finish", "finish check (finish_run_if_drained)"),
    ("gate", "gate pass (enforce_gate, due)"),
    ("pass_steady", "reconciler pass, steady (window full, none due)"),
    ("pass_due", "reconciler pass, all {queued:,} waiting and due"),
    ("pass_lost", "reconciler pass, the same, the 1,000th lost"),
    ("status", "regen status --run big"),
    ("status_json", "regen status --run big --json"),
]


# --- the child: one side's measurements on the shared ledger ------------------------------------------


def _median_ms(fn, repeat: int, before=None) -> list[float]:
    """[median, fastest] of ``repeat`` calls, in ms: the median is what a shared machine gives, the
    fastest what the work costs when nothing else runs."""
    times = []
    for _ in range(repeat):
        if before:
            before()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return [statistics.median(times), min(times)]


def _child(args) -> dict:
    import redis as redis_lib
    from click.testing import CliRunner
    from sqlalchemy import text

    from ledger import transitions
    from ledger.db import make_engine, make_sessionmaker
    from ledger.dispatch import make_celery
    from ledger.quality import enforce_gate
    from ledger.reconcile import reconcile_once
    from ledger.settings import Settings
    from producer.cli import main as cli

    settings = Settings(database_url=args.database_url, redis_url=args.redis_url)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    app = make_celery(settings)
    r = redis_lib.Redis.from_url(args.redis_url)
    out: dict = {}

    def finish():
        with sessions.begin() as s:
            assert not transitions.finish_run_if_drained(s, args.run_id)

    def gate_due():
        with sessions.begin() as s:
            s.execute(text("UPDATE runs SET gate_checked_at = NULL WHERE id = :r"), {"r": args.run_id})

    def gate():
        assert enforce_gate(sessions, args.run_id) is not None

    def one_pass(expect_lost=0):
        def run():
            report = reconcile_once(sessions, app, lease_s=30, max_attempts=3, window=args.window)
            assert report.lost == expect_lost and report.topped_up == 0, report
        return run

    def stamp(sql: str) -> None:
        with sessions.begin() as s:
            s.execute(text("UPDATE batches b SET enqueued_at = " + sql + " FROM (SELECT min(seq) AS first, max(seq) "
                           "AS last FROM batches WHERE run_id = :r AND status = 'queued') m "
                           "WHERE run_id = :r AND status = 'queued'"), {"r": args.run_id})

    # Published in seq order, 1 ms apart, the last 10 s ago: within the grace period, as a busy farm's are.
    stamp("now() - make_interval(secs => 10 + (m.last - b.seq) * 0.001)")
    out["finish"] = _median_ms(finish, args.repeat)
    out["gate"] = _median_ms(gate, args.repeat, before=gate_due)
    out["pass_steady"] = _median_ms(one_pass(), args.repeat)
    # Published by passes 10 s apart, 1,000 each, the first 2 hours ago: every one past its grace period,
    # as a small farm's queue is.
    stamp("now() - interval '2 hours' + make_interval(secs => (b.seq - m.first) / 1000 * 10)")
    try:
        out["pass_due"] = _median_ms(one_pass(), args.repeat)
        # The 1,000th message from the head is lost (delivered to a consumer that died): each pass finds
        # it; between passes its republished copy is taken off the front and its age restored.
        middle = r.lindex(args.queue, -1000)  # among the oldest (REPUBLISH_PER_PASS) queued batches
        lost_id = json.loads(middle)["headers"]["regen_batch"]
        r.lrem(args.queue, 1, middle)
        with sessions() as s:
            lost_at = s.execute(text("SELECT enqueued_at FROM batches WHERE id = :b"), {"b": lost_id}).scalar()

        def unpublish():
            if json.loads(r.lindex(args.queue, -1))["headers"]["regen_batch"] == lost_id:
                r.rpop(args.queue)
            with sessions.begin() as s:
                s.execute(text("UPDATE batches SET enqueued_at = :t WHERE id = :b"), {"t": lost_at, "b": lost_id})

        out["pass_lost"] = _median_ms(one_pass(expect_lost=1), args.repeat, before=unpublish)
        unpublish()
        r.rpush(args.queue, middle)  # back, at the head: no message is missing for status

        runner = CliRunner()
        env = {"DATABASE_URL": settings.database_url, "REDIS_URL": args.redis_url}

        def status(*flags):
            def run():
                result = runner.invoke(cli, ["status", "--run", "big", *flags], env=env, catch_exceptions=False)
                assert result.exit_code == 0 and "big" in result.output, result.output
                out.setdefault("status_text" + "_".join(flags), result.output)
            return run

        out["head_read"] = _head_read(sessions, r, args)
        out["status"] = _median_ms(status(), args.repeat)
        out["status_json"] = _median_ms(status("--json"), args.repeat)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "producer.cli", "status", "--run", "big"], check=True,
                       capture_output=True, env={**os.environ, **env})
        out["status_process"] = (time.perf_counter() - t) * 1000
    finally:
        stamp("now() - make_interval(secs => 10 + (m.last - b.seq) * 0.001)")
    engine.dispose()
    return out


def _head_read(sessions, r, args) -> str:
    """Messages a pass reads from Redis in the "all due" case: the head (this tree) or the whole queue."""
    try:
        from ledger.broker import find_at_head
    except ImportError:
        return f"{r.llen(args.queue):,} (the whole queue)"
    from sqlalchemy import text

    with sessions() as s:
        ids = s.execute(text("SELECT id FROM batches WHERE run_id = :r AND status = 'queued' ORDER BY enqueued_at "
                             "LIMIT 2000"), {"r": args.run_id}).scalars().all()
    scan = find_at_head(r, args.queue, ids, must=len(ids))
    return f"{scan.read:,} of {scan.length:,} (the head)"


# --- the parent: the ledger, both sides, the table -----------------------------------------------------


def _fill(sessions, args) -> int:
    from sqlalchemy import text

    run_sql, batches_sql, samples_sql, counts_sql = FILL_SQL.read_text().split(";\n")
    done = args.batches // 2
    with sessions.begin() as s:
        run_id = s.execute(text(run_sql), {"queue": args.queue}).scalar()
        # seq order: done, then running, then queued, then planned.
        s.execute(text(batches_sql), {"run": run_id, "done": done, "running": args.running, "queued": args.queued,
                                      "n": args.batches})
        s.execute(text(samples_sql), {"run": run_id, "failed": args.failed, "done": done})
        s.execute(text(counts_sql), {"run": run_id, "failed": args.failed, "done": done, "n": args.batches})
    return run_id


def _publish_queued(sessions, app, queue: str, run_id: int) -> None:
    """The queued batches' messages, in publish order, as submit and the top-ups left them."""
    from sqlalchemy import text

    from ledger.dispatch import BatchMessage, publish_messages

    with sessions() as s:
        rows = s.execute(text("SELECT id, seq, input_key FROM batches WHERE run_id = :r AND status = 'queued' "
                              "ORDER BY enqueued_at"), {"r": run_id}).all()
    publish_messages(app, [BatchMessage(run="big", run_id=run_id, batch_id=b.id, seq=b.seq, input_key=b.input_key)
                           for b in rows], queue=queue)


def _side(code_root: str, args, database_url: str, run_id: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([code_root, str(ROOT)])}
    argv = [sys.executable, "-m", "bench.reconcile_scale", "--child", "--database-url", database_url,
            "--run-id", str(run_id), "--queue", args.queue, "--queued", str(args.queued),
            "--window", str(args.window), "--repeat", str(args.repeat), "--redis-url", args.redis_url]
    done = subprocess.run(argv, env=env, cwd=code_root, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the {code_root} side failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _reads(node: dict):
    """What a plan node and those under it read: node type, relation or index, rows."""
    if "Relation Name" in node or "Index Name" in node:
        yield (f"{node['Node Type']} {node.get('Index Name') or node.get('Relation Name')} "
               f"({node.get('Actual Rows', 0) * node.get('Actual Loops', 1):,.0f} rows)")
    for child in node.get("Plans", []):
        yield from _reads(child)


def _explain_status(conn, run_id: int) -> list[str]:
    """Each statement of status's per-run path with its plan's time and what it read."""
    from ledger.defaults import QUEUED_GRACE_S
    from producer.monitoring.status import status_statements

    lines = []
    for label, sql, params in status_statements(run_id, grace_s=QUEUED_GRACE_S):
        plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params).fetchone()[0][0]
        top = plan["Plan"]
        nodes = list(_reads(top))
        lines.append(f"  {plan['Execution Time']:8.1f} ms  {label}: {'; '.join(nodes) or top['Node Type']}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=1_562_500)
    p.add_argument("--window", type=int, default=10_000)
    p.add_argument("--queued", type=int, default=17_000, help="queued batches, all waiting on the queue")
    p.add_argument("--running", type=int, default=20_000)
    p.add_argument("--failed", type=int, default=100_000, help="failed samples (0.1%% of 100M)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--before", default=None, help="git revision to compare with (default: this tree alone)")
    p.add_argument("--admin-dsn", default=ADMIN, help="a Postgres to create the scratch database on; 'local': the one "
                   "on 127.0.0.1:5432 if it answers, else an embedded one (the lent GPU machine has none)")
    p.add_argument("--redis-url", default=REDIS_URL, help="'local': the one on 127.0.0.1:6379, else a redis-server "
                   "of the bench's own")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--database-url", help=argparse.SUPPRESS)
    p.add_argument("--run-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--queue", default=f"regen-scale-{uuid.uuid4().hex[:6]}", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    with contextlib.ExitStack() as stack:
        if args.admin_dsn == "local":
            from local.services import local_postgres

            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="regen-scale-pg-"))
            args.admin_dsn, _ = stack.enter_context(local_postgres(Path(folder)))
        if args.redis_url == "local":
            from local.services import local_redis

            args.redis_url, _ = stack.enter_context(local_redis())
        _parent(args)


def _parent(args) -> None:

    import psycopg
    import redis as redis_lib

    from ledger import migrate
    from ledger.db import make_engine, make_sessionmaker
    from ledger.dispatch import make_celery
    from ledger.settings import Settings
    from local.services import with_database

    name = f"regen_scale_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    settings = Settings(database_url=with_database(args.admin_dsn, name), redis_url=args.redis_url)
    r = redis_lib.Redis.from_url(args.redis_url)
    try:
        migrate.upgrade(settings)
        engine = make_engine(settings)
        sessions = make_sessionmaker(engine)
        t0 = time.perf_counter()
        run_id = _fill(sessions, args)
        with psycopg.connect(settings.libpq_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")  # as autovacuum leaves a ledger between bursts
        _publish_queued(sessions, make_celery(settings), args.queue, run_id)
        engine.dispose()
        print(f"ledger: {args.batches:,} batches ({args.batches * 64:,} samples' worth) written in "
              f"{time.perf_counter() - t0:.0f} s: half done, {args.running:,} running, {args.queued:,} queued "
              f"(all waiting on Redis, {r.memory_usage(args.queue) / 2**20:.1f} MB), the rest planned; "
              f"{args.failed:,} failed sample rows")
        sides = {}
        if args.before:
            with tempfile.TemporaryDirectory(prefix="regen-before-") as root:
                archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", args.before, "ledger",
                                          "producer", "migrations"], check=True, capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
                (Path(root) / "bench").symlink_to(ROOT / "bench")
                sides["before"] = _side(root, args, settings.database_url, run_id)
        sides["after"] = _side(str(ROOT), args, settings.database_url, run_id)
        names = list(sides)
        head = "".join(f"{n + (' (' + args.before + ')' if n == 'before' else ''):>24}" for n in names)
        print(f"\nms, median (fastest) of {args.repeat}; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores\n{'':50}{head}{'goal':>8}")
        for key, label in ROWS:
            cells = "".join(f"{sides[n][key][0]:14.1f} ({sides[n][key][1]:6.1f})" for n in names)
            verdict = "ok" if sides[names[-1]][key][0] < GOAL_MS else "OVER"
            print(f"{label.format(**vars(args)):50}{cells}  <{GOAL_MS:.0f} {verdict}")
        print(f"{'regen status --run big, a new process (start-up too)':50}"
              + "".join(f"{sides[n]['status_process']:23.1f}" for n in names))
        for n in names:
            print(f"messages read from Redis by a pass, all due ({n}): {sides[n]['head_read']}")
        print("\nthis tree's status statements (EXPLAIN ANALYZE, one run):")
        with psycopg.connect(settings.libpq_url) as conn:
            for line in _explain_status(conn, run_id):
                print(line)
        text = sides["after"]["status_text"].splitlines()
        workers = [line for line in text if line.startswith("  worker ")]
        shown = [line for line in text if not line.startswith("  worker ")]
        print("\nregen status --run big (this tree):\n" + "\n".join(shown[:-1] + workers[:2]
              + [f"  ... ({len(workers):,} worker lines in all)", shown[-1]]))
    finally:
        r.delete(args.queue)
        with psycopg.connect(args.admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
