"""Control-plane scale: submit a dataset of N synthetic conversations and report what it cost.

    python -m bench.submit_scale --rows 914000

Generates (or reuses) N rows of 1-2 KB as JSONL files, then runs the real
``submit_run`` into a scratch Postgres database, a moto S3 server and a Redis
queue of its own, and prints: total time and rows/s, where the time went (the
submit's own phase timings), the producer's peak memory, Redis memory and queue
length, the database size, and how long ``regen status`` takes on that ledger.
Everything it creates is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import redis as redis_lib
from sqlalchemy import text

from bench.prompts import write_scale_dataset
from bench.scratch import DEFAULT_ADMIN_DSN, DEFAULT_REDIS_URL, scratch_services
from ledger.db import make_engine, make_sessionmaker
from ledger.dispatch import make_celery
from ledger.objects import ObjectStore
from producer.monitoring.status import run_status
from producer.run_config import RunConfig
from producer.submit import submit_run

ROOT = Path(__file__).resolve().parents[1]


class PeakRss:
    """Samples this process's RSS every 50 ms: the peak *during* the submit, not since start."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._proc = psutil.Process()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def postgres_cpu_s(database: str) -> dict[int, float]:
    """CPU seconds so far of each Postgres process serving ``database`` (backends, autovacuum workers).

    Their process titles name the database; the server's shared processes (WAL writer,
    checkpointer), which serve everyone on this machine, are left out.
    """
    cpu = {}
    for proc in psutil.process_iter(["cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        if title.startswith("postgres:") and f" {database} " in f"{title} ":
            with contextlib.suppress(psutil.Error):
                cpu[proc.pid] = sum(proc.cpu_times()[:2])
    return cpu


def time_status_cli(env: dict[str, str], run: str, repeats: int) -> list[float]:
    """Wall time of ``regen status --run RUN`` as a user runs it (a fresh process each time)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "producer.cli", "status", "--run", run], env=env, cwd=ROOT,
                       check=True, capture_output=True, timeout=120)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.submit_scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=914_000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--files", type=int, default=8, help="JSONL files the rows are spread over")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default="/tmp/regen-bench-data",
                   help="where the dataset is written (reused when it already holds the same rows)")
    p.add_argument("--status-repeats", type=int, default=3)
    p.add_argument("--admin-dsn", default=os.environ.get("REGEN_BENCH_PG", DEFAULT_ADMIN_DSN))
    p.add_argument("--redis-url", default=os.environ.get("REGEN_BENCH_REDIS", DEFAULT_REDIS_URL))
    p.add_argument("--input", default=None,
                   help="submit this file or folder instead of generated rows (e.g. a ShareGPT JSON array from "
                        "bench.json_array_memory): its rows are read as submit reads them")
    args = p.parse_args(argv)

    start = time.perf_counter()
    if args.input:
        paths = [Path(args.input)]
        size = sum(f.stat().st_size for f in (paths[0].rglob("*") if paths[0].is_dir() else paths) if f.is_file())
        print(f"dataset: {args.input}, {_mb(size)}")
    else:
        data_dir = Path(args.data_dir) / f"scale-{args.rows}-{args.seed}"
        paths = write_scale_dataset(data_dir, args.rows, seed=args.seed, files=args.files)
        size = sum(path.stat().st_size for path in paths)
        print(f"dataset: {args.rows:,} rows, {len(paths)} files, {_mb(size)} ({size / args.rows:,.0f} B/row) in "
              f"{data_dir} (ready in {time.perf_counter() - start:.0f} s)")

    with scratch_services(admin_dsn=args.admin_dsn, redis_url=args.redis_url) as scratch:
        settings = scratch.settings
        engine = make_engine(settings)
        sessions = make_sessionmaker(engine)
        app = make_celery(settings)
        redis = redis_lib.Redis.from_url(settings.redis_url)
        redis_before = int(redis.info("memory")["used_memory"])
        config = RunConfig(model="bench/no-model", max_tokens=2048, sampling={"temperature": 1.0})
        run = "scale"
        print(f"load average before submit: {_load()}")
        moto = psutil.Process(scratch.moto.pid)
        moto_cpu, own_cpu = sum(moto.cpu_times()[:2]), sum(psutil.Process().cpu_times()[:2])
        pg_before = postgres_cpu_s(scratch.database_name)
        with PeakRss() as rss:
            t0 = time.perf_counter()
            report = submit_run(sessions, app, ObjectStore.from_settings(settings),
                                [str(path) for path in paths], run_name=run, config=config,
                                output_url=f"{scratch.output_root}/scale", batch_size=args.batch_size,
                                queue=scratch.queue)
            elapsed = time.perf_counter() - t0
        moto_cpu, own_cpu = sum(moto.cpu_times()[:2]) - moto_cpu, sum(psutil.Process().cpu_times()[:2]) - own_cpu
        # Processes that ended during the submit are missed: the pool keeps its connections.
        pg_cpu = sum(cpu - pg_before.get(pid, 0.0) for pid, cpu in postgres_cpu_s(scratch.database_name).items())
        load_after = _load()
        queue_len = redis.llen(scratch.queue)
        queue_bytes = redis.memory_usage(scratch.queue, samples=0) or 0
        redis_after = int(redis.info("memory")["used_memory"])
        with engine.connect() as conn:
            db_size = conn.execute(text("SELECT pg_database_size(current_database())")).scalar()
            samples_size = conn.execute(text("SELECT pg_total_relation_size('samples')")).scalar()
        with sessions() as s:
            t = time.perf_counter()
            status = run_status(s, run)[0]
            status_query_s = time.perf_counter() - t
        status_cli = time_status_cli(scratch.env(), run, args.status_repeats)
        # Right after a bulk insert the visibility map is empty, so counting a run's samples
        # by status reads the heap; autovacuum sets it within minutes (its insert threshold
        # is 20% of the table). Timed again after doing what autovacuum will do.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            t = time.perf_counter()
            conn.execute(text("VACUUM (ANALYZE) samples, batches, rejected_rows"))
            vacuum_s = time.perf_counter() - t
        with sessions() as s:
            t = time.perf_counter()
            run_status(s, run)
            status_query_vacuumed_s = time.perf_counter() - t
        status_cli_vacuumed = time_status_cli(scratch.env(), run, args.status_repeats)
        engine.dispose()
        redis.close()

    print()
    print(f"submit of {report.rows_read:,} rows: {elapsed:.1f} s = {report.rows_read / elapsed:,.0f} rows/s "
          f"(load average after: {load_after})")
    print(f"  {report.samples_new:,} samples in {report.batches_new:,} batches of {args.batch_size}, "
          f"{report.rejected:,} rejected, {report.duplicates:,} duplicates")
    print(f"  CPU used during the submit: producer {own_cpu:.1f} s, moto S3 server {moto_cpu:.1f} s, "
          f"Postgres (this database's processes) {pg_cpu:.1f} s (of {2 * elapsed:.0f} core-seconds on 2 cores)")
    timings = getattr(report, "timings_s", None) or {}
    if timings:
        print("  busy time per phase (phases overlap: reading runs while the previous group is written):")
        for phase, seconds in timings.items():
            print(f"    {phase:<22} {seconds:7.1f} s")
    print(f"producer peak RSS during submit: {_mb(rss.peak)} "
          f"(getrusage peak over the whole process: {_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)})")
    print(f"redis: used_memory {_mb(redis_before)} -> {_mb(redis_after)}; queue {queue_len:,} messages, "
          f"{_mb(queue_bytes)} ({queue_bytes / max(1, queue_len):,.0f} B/message)")
    print(f"postgres: database {_mb(db_size)} (samples table with indexes {_mb(samples_size)})")
    print(f"status: {status['samples']['pending']:,} pending; run_status() query {status_query_s * 1000:.0f} ms; "
          f"`regen status --run {run}` wall time: {', '.join(f'{s:.2f} s' for s in status_cli)}")
    print(f"status after VACUUM (ANALYZE) ({vacuum_s:.1f} s, what autovacuum does soon after a bulk insert): "
          f"run_status() query {status_query_vacuumed_s * 1000:.0f} ms; `regen status --run {run}` wall time: "
          f"{', '.join(f'{s:.2f} s' for s in status_cli_vacuumed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
