"""The ledger's write path before and after issue 22, side by side, against the real Postgres.

    python -m bench.ledger_commits --before 0ff0e2d          # the revision to compare with

Runs the same measurements twice, each in a child process of its own with a scratch
database migrated by that code's migrations: once with the ``--before`` revision's
``ledger``/``worker``/``migrations`` packages first on ``PYTHONPATH`` (unpacked from git),
once with this tree's. Both sides call the same public functions (``commit_batch``,
``finish_run_if_drained``, ``quality_counts``), so what differs is only the code under them:

- commit latency: one thread, one batch of 64 samples per commit (median, p99);
- commits/s of ``--threads`` threads into ONE run, and into one run EACH: if a run's commits
  are serialised the first is far below the second; unserialised the two are alike;
- the finish check on one run of ``--big-batches`` batches (1,562,500 = 100M samples of 64)
  at 50%, 95% and 100% done, with the shared buffers its plan touched (EXPLAIN ANALYZE);
- the gate's count on a run of ``--big-samples`` samples, with the buffers its plan touched.

Prints one table, the two sides in columns. Timing on a shared machine is noisy: read
the ratios. Everything it creates is dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ADMIN_DSN = "postgresql://127.0.0.1:5432/test"
PACKAGES = ("ledger", "worker", "migrations", "producer")
SAMPLES_PER_BATCH = 64
CLASSES = ("ok", "ok", "ok", "ok", "stub_answer", "empty_reasoning", "truncated_answer", "failed")


# --- the child: one side's measurements ---------------------------------------------------------------


def _row(sample_id: str, i: int) -> dict:
    failed = i % 16 == 0
    return {"sample_id": sample_id, "status": "failed" if failed else "done", "finish_reason": "stop",
            "stop_reason": None, "turns": 1, "tool_calls": 0, "quality": CLASSES[i % len(CLASSES)],
            "usage": {"prompt_tokens": 100, "completion_tokens": 1500, "reasoning_tokens": 1000,
                      "answer_tokens": 500},
            "error": {"reason": "prompt_too_long", "detail": "x"} if failed else None}


def _new_run(s, name: str) -> int:
    from sqlalchemy import text

    return s.execute(text(
        "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
        "VALUES (:n, 'm', '{}', 'h', 's3://b/x', 'regen', 64, 'active') RETURNING id"), {"n": name}).scalar_one()


def _claimed_run(sessions, name: str, n_batches: int) -> tuple[int, list[tuple[int, list[dict]]]]:
    """A run of ``n_batches`` running batches (attempt 1) of 64 pending samples; each batch's rows."""
    from sqlalchemy import text

    from ledger import transitions

    with sessions.begin() as s:
        run = _new_run(s, name)
        ids = transitions.insert_batches(s, run, [(i + 1, f"k{i}", SAMPLES_PER_BATCH) for i in range(n_batches)])
        transitions.copy_pending_samples(s, run, ((f"{name}-{b}-{j}", bid, "f", j) for b, bid in enumerate(ids)
                                                   for j in range(SAMPLES_PER_BATCH)))
        s.execute(text("UPDATE batches SET status = 'running', attempts = 1, heartbeat_at = now() "
                       "WHERE run_id = :r"), {"r": run})
    work = [(bid, [_row(f"{name}-{b}-{j}", j) for j in range(SAMPLES_PER_BATCH)]) for b, bid in enumerate(ids)]
    return run, work


def _commit(sessions, run: int, batch: int, rows: list[dict]) -> None:
    from worker.batches.ledger_calls import commit_batch

    assert commit_batch(sessions, run_id=run, batch_id=batch, attempt=1, output_key=f"s3://b/o/{batch}",
                        output_sha256="0" * 64, rows=rows), f"batch {batch} fenced off"


def _parallel(sessions, jobs: list[tuple[int, int, list[dict]]], threads: int) -> float:
    """Commits/s of ``threads`` threads working through ``jobs`` (run, batch, rows)."""
    lock = threading.Lock()
    pending = list(jobs)
    errors: list[BaseException] = []

    def loop() -> None:
        while True:
            with lock:
                if not pending:
                    return
                run, batch, rows = pending.pop()
            try:
                _commit(sessions, run, batch, rows)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return len(jobs) / elapsed


def _plan_of(engine, sessions, fn) -> tuple[float, int]:
    """(ms, shared buffers hit + read) of the last statement ``fn`` ran, under EXPLAIN ANALYZE, rolled back.

    The statement is caught at the cursor, so each side explains its own SQL.
    """
    from sqlalchemy import event

    caught: list = []

    def catch(conn, cursor, statement, parameters, context, executemany) -> None:
        caught.append((statement, parameters))
    event.listen(engine, "before_cursor_execute", catch)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", catch)
    statement, parameters = caught[-1]
    with sessions() as s:
        raw = s.connection().connection.driver_connection
        with raw.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters)
            plan = cur.fetchone()[0][0]
        s.rollback()
    node = plan["Plan"]
    return plan["Execution Time"], node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


def _big_run(sessions, name: str, n_batches: int, done_share: float) -> int:
    """A run of ``n_batches`` batches (no samples), the first ``done_share`` of them done, the rest queued."""
    from sqlalchemy import text

    with sessions.begin() as s:
        run = _new_run(s, name)
        s.execute(text(
            "INSERT INTO batches (run_id, seq, status, input_key, n_samples, attempts, failures) "
            "SELECT :r, g, CASE WHEN g <= :done THEN 'done' ELSE 'queued' END, 'k', 64, 1, 0 "
            "FROM generate_series(1, :n) g"), {"r": run, "n": n_batches, "done": int(n_batches * done_share)})
    return run


def _timed_median(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(admin_dsn: str, args) -> dict:
    import psycopg
    from sqlalchemy import text

    from ledger import migrate, transitions
    from ledger.db import make_engine, make_sessionmaker
    from ledger.quality import quality_counts
    from ledger.settings import Settings
    from local.services import with_database

    out: dict = {}
    name = f"regen_bench_commits_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        settings = Settings(database_url=with_database(admin_dsn, name))
        migrate.upgrade(settings)
        engine = make_engine(settings, pool_size=args.threads + 2)
        sessions = make_sessionmaker(engine)

        # 1. latency, one thread
        run, work = _claimed_run(sessions, "latency", args.latency_commits)
        times = []
        for batch, rows in work:
            start = time.perf_counter()
            _commit(sessions, run, batch, rows)
            times.append((time.perf_counter() - start) * 1000)
        times.sort()
        out["commit_ms_p50"] = statistics.median(times)
        out["commit_ms_p99"] = times[min(len(times) - 1, int(len(times) * 0.99))]

        # 2. one run vs a run per thread
        run, work = _claimed_run(sessions, "one-run", args.parallel_commits)
        out["commits_s_one_run"] = _parallel(sessions, [(run, b, rows) for b, rows in work], args.threads)
        jobs = []
        per = args.parallel_commits // args.threads
        for t in range(args.threads):
            run, work = _claimed_run(sessions, f"own-run-{t}", per)
            jobs += [(run, b, rows) for b, rows in work]
        out["commits_s_run_each"] = _parallel(sessions, jobs, args.threads)

        # 3. the finish check on a 100M-sample run's batches
        for share in (0.5, 0.95, 1.0):
            run = _big_run(sessions, f"big-{share}", args.big_batches, share)
            # As autovacuum leaves a long run's table: visibility map set, statistics current.
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE batches"))
            key = f"finish_{int(share * 100)}"

            def check(run=run) -> None:
                with sessions() as s:
                    transitions.finish_run_if_drained(s, run)
                    s.rollback()
            check()  # warm the cache: both sides measured warm
            out[key + "_ms"] = _timed_median(check)
            out[key + "_plan_ms"], out[key + "_buffers"] = _plan_of(engine, sessions, check)

        # 4. the gate's count on a big run's samples
        with sessions.begin() as s:
            run = _new_run(s, "gate")
            (batch,) = transitions.insert_batches(s, run, [(1, "k", args.big_samples)])
            s.execute(text(
                "INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status, quality) "
                "SELECT :r, 's' || g, :b, 'f', g, 'done', (CAST(:classes AS text[]))[1 + g % :k] "
                "FROM generate_series(1, :n) g"),
                {"r": run, "b": batch, "n": args.big_samples, "classes": list(CLASSES), "k": len(CLASSES)})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE samples"))

        def gate(run=run) -> None:
            with sessions() as s:
                counts = quality_counts(s, run)
            assert sum(counts.values()) == args.big_samples, counts
        gate()
        out["gate_ms"] = _timed_median(gate)
        out["gate_plan_ms"], out["gate_buffers"] = _plan_of(engine, sessions, gate)
        engine.dispose()
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    return out


# --- the parent: both sides, one table ---------------------------------------------------------------


def _unpack(revision: str, into: str) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision, *PACKAGES],
                             check=True, capture_output=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(into, filter="data")


def _side(code_root: str, args) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([code_root, str(ROOT)])}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--admin-dsn", args.admin_dsn,
            "--threads", str(args.threads), "--latency-commits", str(args.latency_commits),
            "--parallel-commits", str(args.parallel_commits), "--big-batches", str(args.big_batches),
            "--big-samples", str(args.big_samples)]
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, cwd=code_root)
    return json.loads(done.stdout.strip().splitlines()[-1])


ROWS = [
    ("commit_ms_p50", "commit, 1 thread, 64 samples: p50 ms"),
    ("commit_ms_p99", "commit, 1 thread: p99 ms"),
    ("commits_s_one_run", "commits/s, {threads} threads, one run"),
    ("commits_s_run_each", "commits/s, {threads} threads, a run each"),
    ("one_run_share", "one run / a run each"),
    ("finish_50_ms", "finish check, {big_batches:,} batches, 50% done: ms"),
    ("finish_50_buffers", "  its plan's shared buffers"),
    ("finish_95_ms", "finish check, 95% done: ms"),
    ("finish_95_buffers", "  its plan's shared buffers"),
    ("finish_100_ms", "finish check, 100% done (the last commit): ms"),
    ("finish_100_buffers", "  its plan's shared buffers"),
    ("gate_ms", "gate count, {big_samples:,} samples: ms"),
    ("gate_buffers", "  its plan's shared buffers"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", default="main", help="git revision of the code to compare with, or a folder "
                        "holding its ledger, worker, migrations and producer packages")
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN,
                        help="'local': the Postgres on 127.0.0.1:5432 if it answers, else an embedded one of the "
                             "bench's own (the lent GPU machine has none)")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--latency-commits", type=int, default=200)
    parser.add_argument("--parallel-commits", type=int, default=1600)
    parser.add_argument("--big-batches", type=int, default=1_562_500)
    parser.add_argument("--big-samples", type=int, default=2_000_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.admin_dsn, args)))
        return
    with contextlib.ExitStack() as stack:
        if args.admin_dsn == "local":
            from local.services import local_postgres

            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="regen-commits-pg-"))
            args.admin_dsn, _ = stack.enter_context(local_postgres(Path(folder)))
        _compare(args)


def _compare(args) -> None:
    if Path(args.before).is_dir():
        # The packages already unpacked (``git archive REV ledger worker migrations producer | tar -x -C DIR``):
        # where the bench runs without the repository's history, as on the lent GPU machine.
        revision = args.before
        before = _side(str(Path(args.before).resolve()), args)
    else:
        revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], check=True,
                                  capture_output=True, text=True).stdout.strip()
        with tempfile.TemporaryDirectory(prefix="regen-before-") as before_root:
            _unpack(revision, before_root)
            before = _side(before_root, args)
    after = _side(str(ROOT), args)
    for side in (before, after):
        side["one_run_share"] = side["commits_s_one_run"] / side["commits_s_run_each"]
    print(f"ledger write path: before = {revision}, after = this tree; Postgres at {args.admin_dsn}")
    print(f"{'':58} {'before':>12} {'after':>12} {'after/before':>13}")
    for key, label in ROWS:
        b, a = before[key], after[key]
        ratio = a / b if b else float("nan")
        fmt = (lambda v: f"{v:12.2f}") if isinstance(b, float) else (lambda v: f"{v:12,}")
        print(f"{label.format(**vars(args)):58} {fmt(b)} {fmt(a)} {ratio:13.3f}")


if __name__ == "__main__":
    main()
