"""A farm of 8, 64 and 1,000 simulated GPUs against one Postgres (through PgBouncer), one Redis and S3.

    python -m bench.farm                          # all three sizes, ~20 min on 2 cores
    python -m bench.farm --gpus 64 --samples 914000 --time-factor 4

What is real: the worker processes (``python -m worker.process.consumer --fake-engine ...``: the whole
batch path, Celery on Redis, claim, input read from S3 (moto server), upload, verify, commit, gate,
heartbeats, reconciler, the holding policy), ``regen submit``'s ``submit_run`` of a run of
``--samples`` samples (default 914,000), a real PgBouncer in transaction mode in front of a scratch
database of the machine's Postgres (``REGEN_DB_POOLER=transaction``), a Redis of the bench's own.
What is played: the engine (worker/engine/fake.py: token ids at a set rate, no vLLM), and where
the machine's 2 cores cannot run a farm's worker processes, the ledger calls those processes
would make, through the real functions (below). Nothing is mocked.

Load per simulated GPU (issue 22): 6.7 samples/s, batches of 64 (0.105 commits/s), one heartbeat
statement per GPU process per 5 s. Fake answers are short (mean 20 tokens, lognormal sigma 1,
cap 22x the mean like 32,768 over 1,500) and each engine's token rate is 6.7 x 20 = 134 tok/s per
GPU, so samples/s and batches/s are the issue's while S3 objects and rows stay small.

Each size prints a table:

1. **Full path, rate window.** ``min(GPUs, --procs)`` worker processes stand for the size's GPUs
   (``gpus=N`` each), at the real rate (no time compression). A real H200 process holds 122
   batches (~20 min of work), so it reaches its steady state only after ~20 min; these engines
   are small instead (16 sequences per GPU at the same 6.7 samples/s: 4 held batches per GPU,
   steady within ~40 s). The window is measured after ``--warm-s``. To give the ledger the
   heartbeat rows of real holders, a *played* heartbeat load runs beside them: one real
   ``heartbeat()`` statement per GPU every 5 s, each over 122 running batches of a run of its own
   (farm_played.sql). Throughput is what the engines *ended* inside the window (each answer's
   end, recorded by the fake engine), against the farm's rate and the engines' token cap; the
   commits/s beside it are a ledger load, not a throughput (a batch committed inside the window
   holds answers made before it). Where the full path falls short of its target (the 2 cores),
   the table says achieved vs target and the CPU each part used.
2. **Ledger only, at 1,000 GPUs.** The real ``claim_batch``, ``commit_batch`` (64 rows),
   ``enforce_gate`` and ``reconcile_once`` (offered by every process every 10 s) from threads at
   the 1,000-GPU rates, plus the played heartbeats, on a run of ``--samples`` written straight into
   the ledger as submit leaves one (planned, its window published), each claim taking the next
   message off the queue (farm_ledger.py). No S3, no engine, no Celery: this is what 1,000 GPUs ask
   of Postgres and PgBouncer. Then a burst: the same calls as fast as 32 threads go, for one run,
   with the machine's CPU and the ledger's lock waits over it; "CPU-bound" or "lock-bound" is
   printed only when those figures show it (farm_report.py ``bound_by``).
3. **The tail, at 64 GPUs.** ``--tail-procs`` processes (64 GPUs between them) with H200-sized
   engines (1,024 sequences per GPU, the derived 122 held batches per GPU and the real holding
   policy) run a whole ``--samples`` run. Time is compressed by ``--time-factor`` F: every engine
   is F x faster, so batch durations, held work and run length keep their ratios while the run
   takes 1/F of its ideal 35 min. Printed: the time from 95% to 100% of the samples done against
   the ideal (5% of the run's ideal time at the farm's full rate), the same against the rate the
   run actually reached between 10% and 90% of its answers *ended* (fairer when the 2 cores, not
   the GPUs, set the pace; counted at commit it once read 148% of what the engines can make),
   and the idle GPU share: 1 - tokens made / (the farm's token rate x the run's time, first
   claim to last commit). Heartbeats here are the 16 processes' own (one per 4 GPUs).
   **A scale model for 2 cores** (``--tail-seqs 256 --samples 228500``): 7,808 held batches are
   7,808 task threads, and on 2 cores their heartbeats starve, leases expire and the run thrashes
   (seen: 5,400 lease expiries in 10 minutes), which measures the machine, not the policy. With
   engines of 1/4 the sequences at the same samples/s per GPU, each GPU holds 32 batches (the
   same derivation, worker/engine/admission.py) and a run of 1/4 the samples keeps every ratio that makes
   the tail: held work over the run (2,048 of 3,570 batches, against 7,808 of 14,282), a batch's
   duration over the run's ideal time, the lognormal lengths. The holding policy's own periods
   (a backlog check per heartbeat, 5 s) do not shrink with it, so the model is, if anything,
   harder on the policy than the full run.

How to read the latencies: client-side, per call kind (worker/measure/ledger_timing.py, switched on by
``REGEN_LEDGER_TIMING`` in the workers and in this process), a whole transaction each, the pool
wait and retries included: ``claim``, ``heartbeat``, ``commit``, ``gate`` (the due check after
every commit), ``gate_pass`` (an evaluation), ``reconcile_offer`` (another pass was recent),
``reconcile_pass``, ``release`` (a worker handing batches back when it stops). Connections:
``server`` is the ledger database's backends (pg_stat_activity, sampled each second), ``clients``
is PgBouncer's (SHOW POOLS). Redis: ``used_memory`` and commands/s (INFO). The queries that grow
with a 100M-sample ledger (finish check, gate, reconciler pass, ``regen status``) are measured by
bench/reconcile_scale.py and bench/ledger_commits.py; the summary points to their results.
Every p50/p99 stands beside its call count; a p99 of fewer than 200 calls is printed as the max
of N (farm_report.py). On a shared 2-core machine every figure is a floor for a real server:
read them with the CPU line, which gives the whole machine's busy cores beside the bench's.

Its processes never outlive it (farm_services.py): a killed bench's workers and PgBouncer are
stopped by the production reaper, moto and Redis by their parent-death signal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench import farm_ledger
from bench.farm_report import Burst, Table, read_ends, read_timings, summary
from bench.farm_services import POOL_SIZE, Farm, Sampler, farm_services
from bench.farm_workers import (
    H200_SEQS,
    MEAN_TOKENS,
    SAMPLES_S_PER_GPU,
    WINDOW_SEQS,
    PlayedHeartbeats,
    batch_states,
    run_figures,
    run_finished,
    start_workers,
    submit,
    write_dataset,
)
from bench.scratch import DEFAULT_ADMIN_DSN
from bench.submit_scale import postgres_cpu_s
from local.services import local_postgres
from worker.engine.admission import batches_to_hold
from worker.measure import ledger_timing
from worker.measure.ledger_timing import SEQUENCE

COMMITS_S_PER_GPU = SAMPLES_S_PER_GPU / 64


def _procs(gpus: int, most: int) -> int:
    """The most processes (at most ``most``) that share ``gpus`` evenly."""
    return max(k for k in range(1, min(gpus, most) + 1) if gpus % k == 0)


def _machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy (not idle, not waiting on I/O), all processes."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class Cpu:
    """CPU seconds of the bench's parts over a window: workers, moto, the ledger's Postgres backends,
    PgBouncer, this process (the played load), and the whole machine's (``machine``: the other users
    of a shared machine included), each divided by the window's length (cores)."""

    def __init__(self, farm: Farm, workers=None):
        self.farm, self.workers = farm, workers
        self.bouncer = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "pgbouncer"]
        self.start = self._now()
        self.t = time.monotonic()

    def _now(self) -> dict[str, float]:
        def cpu(p) -> float:
            try:
                return sum(p.cpu_times()[:2])
            except psutil.Error:
                return 0.0
        return {"workers": self.workers.cpu_s() if self.workers else 0.0,
                "moto": cpu(psutil.Process(self.farm.scratch.moto.pid)),
                "postgres": sum(postgres_cpu_s(self.farm.scratch.database_name).values()),
                "pgbouncer": sum(cpu(p) for p in self.bouncer), "bench": cpu(psutil.Process()),
                "machine": _machine_busy_s()}

    def cores(self) -> dict[str, float]:
        now = self._now()  # first: on a loaded machine reading the figures takes a while
        elapsed = time.monotonic() - self.t
        return {k: (v - self.start.get(k, 0.0)) / elapsed for k, v in now.items()}


def _warm_up(farm: Farm, run_id: int, procs: int, most_s: float) -> None:
    """Until every process could have committed a batch (as many commits as processes), then 10 s more;
    at most ``most_s``: the first commits come after the first held batches end."""
    start = time.monotonic()
    before = run_finished(farm, run_id)[0]
    while time.monotonic() - start < most_s - 10:
        if run_finished(farm, run_id)[0] - before >= procs * 64:
            break
        time.sleep(2)
    time.sleep(max(0.0, min(10.0, most_s - (time.monotonic() - start))))


def _states(counts: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {status}" for status, n in sorted(counts.items())) or "none"


def rate_window(farm: Farm, args, gpus: int, queue: str, run_id: int, timing: Path) -> Table:
    procs = _procs(gpus, args.procs)
    table = Table(f"{gpus:,} simulated GPUs, full path: {procs} worker processes x {gpus // procs} GPUs, "
                  f"{WINDOW_SEQS} sequences/GPU, real rate; {args.measure_s:.0f} s after a warm-up (first commits + 10 s)",
                  gpus=gpus)
    with PlayedHeartbeats(farm, gpus) as beats:
        workers = start_workers(farm, queue=queue, procs=procs, gpus_each=gpus // procs, seqs=WINDOW_SEQS,
                                time_factor=1.0, timing_dir=str(timing), tag=f"w{gpus}-")
        try:
            _warm_up(farm, run_id, procs, args.warm_s)
            cpu = Cpu(farm, workers)
            t0 = time.time()
            states_before = batch_states(farm, run_id)
            with Sampler(farm) as sampler:
                time.sleep(args.measure_s)
            t1 = time.time()
            cores = cpu.cores()
            exits = [p.poll() for p in workers.procs]
            states_after = batch_states(farm, run_id)
        finally:
            workers.stop()
    ledger_timing.flush()
    timings = read_timings(timing, t0, t1)
    table.fill(timings, sampler.samples, cores, t1 - t0, pool=farm.pool_size)
    table.targets(commits_s=gpus * COMMITS_S_PER_GPU, heartbeats_s=gpus / 5 + procs / 5)
    table.engines(timings.get(SEQUENCE, []), samples_s=gpus * SAMPLES_S_PER_GPU,
                  tok_s=gpus * SAMPLES_S_PER_GPU * MEAN_TOKENS)
    ended = len(timings.get(SEQUENCE, []))
    if ended < 0.01 * gpus * SAMPLES_S_PER_GPU * (t1 - t0) or any(code is not None for code in exits):
        # A window in which the engines made (almost) nothing measures nothing: say why, from the workers'
        # own logs. Seen on the lent 16-core machine: 2 answers in 45 s, twice, where this machine's 2 cores
        # made 14-22% of the farm's rate with the same code, Python and packages (docs/performance.md).
        table.note(f"ALMOST NO ANSWERS or a worker gone: {ended} answers ended; worker exit codes "
                   f"{exits} (None: still running at the window's end)")
        for k in sorted({0, *(k for k, code in enumerate(exits) if code is not None)})[:3]:
            tail_lines = workers.logs[k].read_text(errors="replace").splitlines()[-15:]
            table.note(f"worker {k}'s log ends:\n    " + "\n    ".join(tail_lines or ["(empty)"]))
    table.note(f"the run's batches at the window's start -> end: {_states(states_before)} -> {_states(states_after)}")
    table.note(f"heartbeats: {gpus} played statements / 5 s over 122 held batches each, plus the {procs} "
               f"workers' own over their (4/GPU) held sets; {beats.words()}")
    return table


def ledger_only(farm: Farm, args, gpus: int, timing: Path) -> Table:
    run_id, batch_ids = farm_ledger.write_run(farm, "farm-ledger-only", args.ledger_samples or args.samples)
    commits_s = gpus * COMMITS_S_PER_GPU
    table = Table(f"{gpus:,} simulated GPUs, ledger only: the real ledger calls at the farm's rates from threads "
                  f"through PgBouncer; {args.measure_s:.0f} s", gpus=gpus)
    with PlayedHeartbeats(farm, gpus) as beats:
        cpu = Cpu(farm)
        start = time.time()
        with Sampler(farm) as sampler:
            load = farm_ledger.play(farm, run_id, batch_ids, "farm-ledger-only", gpus=gpus,
                                    seconds=args.measure_s + farm_ledger.HOLD_S, commits_s=commits_s)
        t1 = time.time()
        cores = cpu.cores()
    ledger_timing.flush()
    t0 = start + farm_ledger.HOLD_S  # commits start one hold after the claims
    table.fill(read_timings(timing, t0, t1), sampler.samples, cores, t1 - t0, pool=farm.pool_size)
    table.targets(commits_s=commits_s, heartbeats_s=gpus / 5)
    table.note(f"played: {load.words()}; 48 client connections stand for {gpus:,} processes' {4 * gpus:,}")
    table.note(f"heartbeats: {beats.words()}")
    cpu = Cpu(farm)
    with Sampler(farm, interval_s=0.25) as sampler:
        commits, seconds = farm_ledger.burst(farm, run_id, batch_ids, "farm-ledger-only", seconds=10)
    table.burst = Burst(commits, seconds, machine_busy=cpu.cores()["machine"] / (os.cpu_count() or 1),
                        lock_share=sampler.samples.lock_share(), samples=len(sampler.samples.active_backends))
    table.note(f"burst, one run, 32 threads taking deliveries, claiming and committing as fast as they go: "
               f"{table.burst.words()} (bench/ledger_commits.py compares one run with many)")
    return table


def tail(farm: Farm, args, queue: str, run_id: int, timing: Path) -> Table:
    gpus, procs = 64, args.tail_procs
    f = args.time_factor
    seqs = args.tail_seqs
    table = Table(f"64 simulated GPUs, the tail: a whole run of {args.samples:,} samples, {procs} processes x "
                  f"{gpus // procs} GPUs, {seqs} sequences/GPU ({batches_to_hold(seqs)} held batches/GPU), "
                  f"time x{f:g}", gpus=gpus)
    workers = start_workers(farm, queue=queue, procs=procs, gpus_each=gpus // procs, seqs=seqs, time_factor=f,
                            timing_dir=str(timing), tag="tail-")
    try:
        cpu = Cpu(farm, workers)
        t0 = time.time()
        with Sampler(farm) as sampler:
            deadline = time.monotonic() + args.tail_timeout_s
            while time.monotonic() < deadline:
                done, total = run_finished(farm, run_id)
                if done >= total:
                    break
                time.sleep(5)
        t1 = time.time()
        cores = cpu.cores()
    finally:
        workers.stop()
    figures = run_figures(farm, run_id)
    table.fill(read_timings(timing, t0, t1), sampler.samples, cores, t1 - t0, pool=farm.pool_size)
    ends = [e for e in read_ends(timing) if e[0] >= t0]  # the tail's workers' answers alone
    table.tail(figures, ends, samples=args.samples, gpus=gpus, time_factor=f, timed_out=done < total)
    return table


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.farm", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default="8,64,1000", help="simulated farm sizes, comma-separated")
    p.add_argument("--samples", type=int, default=914_000, help="samples of each run")
    p.add_argument("--ledger-samples", type=int, default=0,
                   help="samples of the ledger-only run (default --samples): written straight into the ledger, "
                        "so a large one costs no submit; 914,000 keeps batches planned beyond the queue's window")
    p.add_argument("--procs", type=int, default=16, help="worker processes at most in a rate window")
    p.add_argument("--warm-s", type=float, default=60.0, help="the most a rate window waits for steady commits")
    p.add_argument("--measure-s", type=float, default=45.0)
    p.add_argument("--tail-procs", type=int, default=16)
    p.add_argument("--time-factor", type=float, default=4.0, help="the tail run's time compression")
    p.add_argument("--tail-timeout-s", type=float, default=900.0)
    p.add_argument("--tail-seqs", type=int, default=H200_SEQS,
                   help="sequences per GPU in the tail phase (a scale model: see the docstring)")
    p.add_argument("--pool-size", type=int, default=POOL_SIZE, help="PgBouncer's server connections")
    p.add_argument("--admin-dsn", default=os.environ.get("REGEN_BENCH_PG", DEFAULT_ADMIN_DSN),
                   help="a Postgres the bench may create its scratch database on; 'local': the one on "
                        "127.0.0.1:5432 if it answers, else an embedded one of the bench's own (a machine "
                        "with none, such as the lent GPU machine)")
    args = p.parse_args(argv)
    sizes = sorted({int(g) for g in args.gpus.split(",") if g.strip()})
    if any(g < 1 for g in sizes) or args.samples < 64:
        p.error("--gpus must be positive sizes and --samples at least one batch (64)")
    # SIGTERM as Ctrl-C: the blocks below stop the workers, PgBouncer, moto, and drop the database.
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"# python -m bench.farm {shlex.join(sys.argv[1:] if argv is None else argv)}", flush=True)
    with contextlib.ExitStack() as stack:
        if args.admin_dsn == "local":
            pg_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="regen-farm-pg-"))
            args.admin_dsn, _ = stack.enter_context(local_postgres(Path(pg_dir)))
        tables = _run(args, sizes)
    print(summary(tables), flush=True)
    return 0


def _run(args, sizes: list[int]) -> list[Table]:
    tables: list[Table] = []
    with farm_services(admin_dsn=args.admin_dsn, pool_size=args.pool_size) as farm, \
            tempfile.TemporaryDirectory(prefix="regen-farm-data-") as data:
        timing = Path(farm.scratch.workdir) / "timing"
        ledger_timing.install(timing)  # the played heartbeats' and the ledger-only calls' latencies
        dataset = write_dataset(Path(data), args.samples)
        tail_run = None
        window_run, seconds = submit(farm, dataset, "farm-window", "farm-window")
        print(f"submitted farm-window: {args.samples:,} samples in {seconds:.0f} s", flush=True)
        if 64 in sizes:
            tail_run, seconds = submit(farm, dataset, "farm-tail", "farm-tail")
            print(f"submitted farm-tail: {args.samples:,} samples in {seconds:.0f} s", flush=True)
        for gpus in sizes:
            tables.append(rate_window(farm, args, gpus, "farm-window", window_run, timing))
            print(tables[-1].render(), flush=True)
            if gpus == 64:
                tables.append(tail(farm, args, "farm-tail", tail_run, timing))
                print(tables[-1].render(), flush=True)
            if gpus >= 1000:
                tables.append(ledger_only(farm, args, gpus, timing))
                print(tables[-1].render(), flush=True)
    return tables


if __name__ == "__main__":
    sys.exit(main())
