"""One system run of bench/throughput.py: a real ``regen worker`` process fed by a real submit.

The worker is started exactly as an operator starts one (``regen worker --gpus none``),
loads its engine, and is warmed up by a small run before the measured one, so neither
the engine load nor the first compilation is counted. The measured figures come from
the ledger the worker commits to, not from the benchmark's own clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import redis as redis_lib
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, ProgrammingError

from bench.scratch import Scratch
from ledger.db import make_engine, make_sessionmaker
from ledger.dispatch import make_celery
from ledger.objects import ObjectStore
from producer import submit as submit_module
from producer.run_config import RunConfig
from producer.submit import get_or_create_run, submit_run
from worker.engine.args import format_engine_args
from worker.engine.occupancy import Window, logged_windows, parse_windows
from worker.engine.stats import SchedulerWindow, added_up, logged_scheduler_windows
from worker.measure import thread_cpu
from worker.process.orphans import die_with_parent

ROOT = Path(__file__).resolve().parents[1]
#: vLLM's CPU build loads the tiny model in ~20-60 s; much longer when other jobs share the cores.
READY_TIMEOUT_S = 900.0
RUN_TIMEOUT_S = 3600.0
WARMUP_ROWS = 16
WARMUP_MAX_TOKENS = 16
#: Queued batches, none running, an empty queue for this long: the messages are gone.
LOST_MESSAGES_S = 60.0


#: The part of a run's window read as its steady state: start-up and drain left out of both ends.
STEADY = (0.2, 0.8)


def steady_tok_s(finished: list[tuple[float, int]], start: float, end: float, *,
                 at_least: int = 20) -> float | None:
    """Output tokens per second that ended in the middle of ``[start, end]`` (``STEADY``), or None.

    Both (a) and (b) lose time at their ends: (a) while ``LLM.generate`` adds every request
    and in the drain, (b) while the first batches are claimed and rendered and in the same
    drain. Over the middle of a long run the tokens of the generations ending per second
    are the rate the engine held, so the two side by side say whether the worker kept the
    engine as busy as bare vLLM, apart from the ends. ``finished``: (time, tokens) of each
    request at its end (a). Not batch commits: a worker holds a hundred batches open, a
    quarter of this workload's tokens, so commits lag the generation by tens of seconds: on
    an H200 they read the middle of a run at 14,640 tok/s where the whole run averaged 15,121.
    """
    lo, hi = _middle(start, end)
    if hi <= lo or sum(1 for t, _ in finished if lo <= t < hi) < at_least:
        return None
    return _ended_tokens(finished, lo, hi) / (hi - lo)


def _ended_tokens(finished: list[tuple[float, int]], lo: float, hi: float, *, through: bool = False) -> int:
    """Tokens of the requests ending in ``[lo, hi)`` (``through``: and at or after ``hi``)."""
    return sum(n for t, n in finished if lo <= t and (t < hi or through))


def _middle(start: float, end: float) -> tuple[float, float]:
    return start + STEADY[0] * (end - start), start + STEADY[1] * (end - start)


def steady_window_tok_s(windows: list[tuple[float, float, int]], start: float, end: float, *,
                        at_least: int = 5) -> float | None:
    """``steady_tok_s`` from the worker's occupancy windows: (start, end, tokens) of each (b).

    worker/engine/occupancy.py counts in each window the tokens of the generations that ended in it.
    A window's tokens count in the share of it that lies in the middle: counting each
    window whole by its end would be off by up to a window (5 s of a 110-s middle, 4.5%)
    depending on where the windows happen to fall. Each window carries its own length (the
    log's ``over``), so the windows of several worker processes in one log add up to their
    total, and a gap where a worker was idle counts as no tokens.
    """
    lo, hi = _middle(start, end)
    counted = sum(1 for t0, t1, _ in windows if min(t1, hi) > max(t0, lo))
    if hi <= lo or counted < at_least:
        return None
    return _window_tokens(windows, lo, hi) / (hi - lo)


def _window_tokens(windows: list[tuple[float, float, int]], lo: float, hi: float) -> float:
    inside = 0.0
    for t0, t1, tokens in windows:
        overlap = min(t1, hi) - max(t0, lo)
        if overlap > 0 and t1 > t0:
            inside += tokens * overlap / (t1 - t0)
    return inside


def run_profile(start: float, end: float, *, finished: list[tuple[float, int]] | None = None,
                windows: list[tuple[float, float, int]] | None = None) -> tuple[float, float, float] | None:
    """Output tok/s ending in the run's first part, its middle and its last part (``STEADY``'s cuts).

    Says where a run loses its time: bare ``LLM.generate`` hands its engine every request
    before the first step, the worker admits them as others end, so the two may spend the
    same admission work at different times (the account docs/performance.md gives of an
    H200 run, which these parts can check). From ``finished`` (a) or
    ``windows`` (b). Ends are lumpy: long answers end late, so the last part reads high
    and the first low in both alike; compare a part with the same part of the other run.
    """
    if end <= start:
        return None
    lo, hi = _middle(start, end)
    parts = ((start, lo), (lo, hi), (hi, end))
    if finished is not None:
        # The last request ends at the run's end: the last part includes it.
        tokens = [_ended_tokens(finished, a, b, through=b == end) for a, b in parts]
    elif windows is not None:
        tokens = [_window_tokens(windows, a, b) for a, b in parts]
    else:
        raise ValueError("run_profile needs finished or windows")
    head, middle, tail = (n / (b - a) for n, (a, b) in zip(tokens, parts, strict=True))
    return head, middle, tail


@dataclass
class WorkerRun:
    tokens: int
    seconds: float
    samples: int
    stopped_early: int
    failed: int
    batches: int
    #: 1-minute load average when the measured run was submitted.
    load: float
    #: Postgres was restarted during the run (by someone else): the figure is not trustworthy.
    disturbed: bool = False
    #: Mean batches between claim and commit over the window (K at best; lower in the drain).
    batches_in_flight: float = 0.0
    #: Tokens per second over the middle of the window (``steady_window_tok_s``), from the worker's windows.
    steady_tok_s: float | None = None
    #: Tokens per second over its first part, middle and last part (``run_profile``).
    profile: tuple[float, float, float] | None = None
    worker_pids: set[int] = field(default_factory=set)
    #: How full the engine was kept (worker/engine/occupancy.py), the worker's windows logged during the run.
    occupancy: Window = field(default_factory=Window)
    #: CPU seconds by thread kind of the worker process(es) over the same windows (worker/measure/thread_cpu.py).
    thread_cpu: dict[str, float] = field(default_factory=dict)
    #: Output tokens of each sample, and how many ended at their budget (finish reason ``length``).
    lengths: list[int] = field(default_factory=list)
    cut: int = 0
    #: vLLM's scheduler over the run (REGEN_ENGINE_STATS=1, worker/engine/stats.py), else None.
    scheduler: SchedulerWindow | None = None

    def thread_cpu_note(self, top: int = 6) -> str:
        if not self.thread_cpu:
            return "worker CPU by thread: no window logged"
        shown = list(self.thread_cpu.items())[:top]
        rest = sum(self.thread_cpu.values()) - sum(v for _, v in shown)
        return "worker CPU by thread: " + ", ".join(f"{k} {v:.1f} s" for k, v in shown) + (
            f", the rest {rest:.1f} s" if rest >= 0.05 else "")

    def occupancy_note(self) -> str:
        o = self.occupancy
        if not o.samples:
            return "engine occupancy: no window logged"
        return (f"engine below max_num_seqs {o.share(o.short_waiting):.1%} of the time with work waiting at the "
                f"gate, {o.share(o.short_idle):.1%} without; {o.requests_mean:,.0f} requests in it on average; "
                f"loop lag mean {o.lag_mean_s * 1e3:.1f} ms, max {o.lag_max_s * 1e3:.0f} ms")


@contextlib.contextmanager
def per_sample_budgets() -> Iterator[None]:
    """Carry each input row's ``max_tokens`` into its normalised sample, for this benchmark only.

    ``normalize_row`` keeps only the fields of docs/CONTRACTS.md, so the benchmark wraps
    it, in submit and in ``regen estimate``'s sample draw alike, while it submits or
    estimates; the worker (and the estimate's probe, which runs the worker's
    ``generate_batch``) then honours ``sample["max_tokens"]`` (it can only lower the run's
    max_tokens). Everything else is the real path. Random weights never stop on their
    own, so this budget is what gives the benchmark its long-tailed output lengths.
    """
    from producer.estimate import sample as sample_module

    modules = (submit_module, sample_module)
    original = submit_module.normalize_row

    def normalize_with_budget(obj):
        sample = original(obj)
        budget = obj.get("max_tokens")
        if type(budget) is int and budget > 0:
            sample["max_tokens"] = budget
        return sample

    for module in modules:
        module.normalize_row = normalize_with_budget
    try:
        yield
    finally:
        for module in modules:
            module.normalize_row = original


class WorkerProcess:
    """``regen worker`` in its own session, logging to a file (``--gpus none``: one CPU engine)."""

    def __init__(self, scratch: Scratch, *, model: str, concurrency: int, engine_args: dict, name: str, queue: str,
                 gpus: str = "none", tp: int = 1, processes: int = 1, reconcile_s: float = 0):
        #: Worker processes the launcher starts (one per GPU group): each logs its own " ready.".
        self.processes = processes
        argv = [sys.executable, "-m", "producer.cli", "worker", "--gpus", gpus, "--tp", str(tp),
                "--concurrency", str(concurrency),
                "--queue", queue, "--model", model, "--node-name", name, "--reconcile-s", str(reconcile_s)]
        for pair in format_engine_args(engine_args):
            argv += ["--engine-arg", pair]
        env = {**scratch.env(), "PYTHONUNBUFFERED": "1",
               # Occupancy windows of 5 s, so a run of a minute has a dozen to add up.
               "REGEN_OCCUPANCY_REPORT_S": os.environ.get("REGEN_OCCUPANCY_REPORT_S", "5"),
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        self.log_path = Path(scratch.workdir) / f"worker-{name}.log"
        with open(self.log_path, "wb") as log:
            # Its own session, but SIGTERMed if the benchmark dies: no worker outlives it.
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                         start_new_session=True, preexec_fn=die_with_parent)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {self.proc.returncode}:\n{self.log_tail()}")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.log_tail(1 << 22).count(" ready.") < self.processes:
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker was not ready after {READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def pids(self) -> set[int]:
        try:
            root = psutil.Process(self.proc.pid)
            return {root.pid, *(p.pid for p in root.children(recursive=True))}
        except psutil.NoSuchProcess:
            return set()

    def stop(self, timeout_s: float = 120.0) -> None:
        """SIGTERM (batches handed back, engine stopped), then SIGKILL whatever it started."""
        pids = self.pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


def _submit(scratch: Scratch, paths: list[Path], config: RunConfig, *, run_name: str, batch_size: int,
            queue: str) -> int:
    settings = scratch.settings
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    output_url = f"{scratch.output_root}/{run_name}"
    try:
        _create_run_without_gate(sessions, run_name, config, output_url=output_url, queue=queue,
                                 batch_size=batch_size)
        report = submit_run(sessions, make_celery(settings), ObjectStore(), [str(p) for p in paths],
                            run_name=run_name, config=config, output_url=output_url, batch_size=batch_size,
                            queue=queue)
    finally:
        engine.dispose()
    if report.rejected or report.duplicates:
        raise RuntimeError(f"the benchmark's rows were rejected: {report.reject_reasons}")
    return report.batches_new


def _create_run_without_gate(sessions, run_name: str, config: RunConfig, **run_args) -> None:
    """Create the run before submitting it, with the quality gate overridden (docs/quality.md).

    Random weights write nothing but truncated noise, which the gate rightly pauses after
    200 samples; a throughput benchmark must run to the end. The gate still evaluates.
    """
    with sessions.begin() as s:
        get_or_create_run(s, run_name, config, **run_args)
    with contextlib.suppress(ProgrammingError), sessions.begin() as s:  # a ledger without the quality gate
        s.execute(text("UPDATE runs SET quality_thresholds = CAST(:t AS jsonb) WHERE name = :run"),
                  {"t": json.dumps({"gate_overridden": True}), "run": run_name})


def _wait_done(scratch: Scratch, worker: WorkerProcess, run_name: str, queue: str) -> None:
    """Until every batch of the run is done or dead.

    Survives a Postgres restart (other people's fault tests restart the shared server),
    and fails instead of hanging when the queue's messages were lost (a FLUSHDB).
    """
    engine = make_engine(scratch.settings)
    redis = redis_lib.Redis.from_url(scratch.settings.redis_url)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        idle_since = None
        while True:
            worker.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_name} not finished after {RUN_TIMEOUT_S:.0f} s:\n{worker.log_tail()}")
            time.sleep(0.5)
            try:
                with engine.connect() as conn:
                    left, running = conn.execute(text(
                        "SELECT count(*) FILTER (WHERE b.status NOT IN ('done', 'dead')), "
                        "count(*) FILTER (WHERE b.status = 'running') "
                        "FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = :run"), {"run": run_name}).one()
            except OperationalError:
                continue  # Postgres restarting; the worker retries its own writes
            if left == 0:
                return
            if running == 0 and redis.llen(queue) == 0:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > LOST_MESSAGES_S:
                    raise RuntimeError(f"run {run_name}: {left} batches wait but the queue is empty: were the "
                                       "messages flushed from Redis by another job? Run the benchmark again.")
            else:
                idle_since = None
    finally:
        engine.dispose()
        redis.close()


def postmaster_started(scratch: Scratch):
    """When the Postgres server last started: a change during a run means someone restarted it."""
    engine = make_engine(scratch.settings)
    try:
        for _ in range(120):
            try:
                with engine.connect() as conn:
                    return conn.execute(text("SELECT pg_postmaster_start_time()")).scalar()
            except OperationalError:
                time.sleep(1)
        raise RuntimeError("Postgres did not come back in 2 minutes")
    finally:
        engine.dispose()


def _measure(scratch: Scratch, run_name: str) -> tuple[int, float, int, int, int, int, float, tuple[float, float]]:
    """Completion tokens, the claim-to-commit window and the mean batches in flight, from the ledger."""
    engine = make_engine(scratch.settings)
    try:
        with engine.connect() as conn:
            first, last, tokens, batches, busy_s = conn.execute(text(
                "SELECT min(b.started_at), max(b.finished_at), coalesce(sum(b.completion_tokens), 0), count(*), "
                "sum(extract(epoch FROM b.finished_at - b.started_at)) "
                "FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = :run AND b.status = 'done'"),
                {"run": run_name}).one()
            samples, stopped, failed = conn.execute(text(
                "SELECT count(*), count(*) FILTER (WHERE s.finish_reason = 'stop'), "
                "count(*) FILTER (WHERE s.status = 'failed') FROM samples s JOIN runs r ON r.id = s.run_id "
                "WHERE r.name = :run"), {"run": run_name}).one()
    finally:
        engine.dispose()
    window_s = (last - first).total_seconds()
    return (int(tokens), window_s, int(samples), int(stopped), int(failed), int(batches), float(busy_s) / window_s,
            (first.timestamp(), last.timestamp()))


def _sample_lengths(scratch: Scratch, run_name: str) -> tuple[list[int], int]:
    """Each done sample's output tokens, and how many ended at their budget, from the ledger."""
    engine = make_engine(scratch.settings)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT s.completion_tokens, s.finish_reason FROM samples s JOIN runs r ON r.id = s.run_id "
                "WHERE r.name = :run AND s.status = 'done'"), {"run": run_name}).all()
    finally:
        engine.dispose()
    return [int(n or 0) for n, _ in rows], sum(reason == "length" for _, reason in rows)


def _warmup_file(jsonl: Path) -> Path:
    path = jsonl.with_name("warmup.jsonl")
    with open(jsonl) as src, open(path, "w") as out:
        for n, line in zip(range(WARMUP_ROWS), src, strict=False):
            row = json.loads(line)
            row.update(id=f"warmup-{n}", max_tokens=WARMUP_MAX_TOKENS)
            out.write(json.dumps(row) + "\n")
    return path


class SystemUnderTest:
    """One ``regen worker`` (K batches in flight) on its own queue, kept up across measured runs.

    Start several (their engines load in parallel), ``wait_ready`` each, then ``run``
    them in turn: a worker that is not being measured is idle (its Celery consumer polls
    Redis once a second, its engine waits for requests), and the benchmark reports how
    much CPU the idle engines took.
    """

    def __init__(self, scratch: Scratch, *, model: str, jsonl: Path, config: RunConfig, concurrency: int,
                 batch_size: int, engine_args: dict, label: str, gpus: str = "none", tp: int = 1,
                 processes: int = 1, reconcile_s: float = 0):
        self.scratch, self.jsonl, self.config, self.batch_size = scratch, jsonl, config, batch_size
        self.queue = f"{scratch.queue}-{label}"
        self.worker = WorkerProcess(scratch, model=model, concurrency=concurrency, engine_args=engine_args,
                                    name=f"bench-{label}", queue=self.queue, gpus=gpus, tp=tp,
                                    processes=processes, reconcile_s=reconcile_s)
        self.label = label

    def wait_ready(self) -> None:
        """Engine loaded, then a small warm-up run (first compilation, first claim): none of it measured."""
        self.worker.wait_ready()
        name = f"{self.label}-warmup"
        with per_sample_budgets():
            _submit(self.scratch, [_warmup_file(self.jsonl)], self.config, run_name=name,
                    batch_size=self.batch_size, queue=self.queue)
        _wait_done(self.scratch, self.worker, name, self.queue)

    def run(self, run_name: str) -> WorkerRun:
        """Submit every prompt as ``run_name``, wait until it is done, measure it from the ledger."""
        load = os.getloadavg()[0]
        pg_started = postmaster_started(self.scratch)
        log_offset = self.worker.log_path.stat().st_size
        with per_sample_budgets():
            expected = _submit(self.scratch, [self.jsonl], self.config, run_name=run_name,
                               batch_size=self.batch_size, queue=self.queue)
        _wait_done(self.scratch, self.worker, run_name, self.queue)
        disturbed = postmaster_started(self.scratch) != pg_started
        tokens, seconds, samples, stopped, failed, batches, in_flight, (first, last) = _measure(self.scratch, run_name)
        if failed or batches != expected:
            raise RuntimeError(f"{run_name}: {batches} of {expected} batches done, {failed} samples failed")
        with open(self.worker.log_path, "rb") as f:
            f.seek(log_offset)
            logged = f.read().decode(errors="replace").splitlines()
        occupancy, cpu = parse_windows(logged), thread_cpu.parse_lines(logged)
        scheduler = logged_scheduler_windows(logged)
        lengths, cut = _sample_lengths(self.scratch, run_name)
        windows = [(w.at - w.seconds, w.at, w.tokens) for w in logged_windows(logged) if w.at and w.seconds]
        steady = steady_window_tok_s(windows, first, last)
        # Too few windows for a steady state are too few for the parts too.
        profile = run_profile(first, last, windows=windows) if steady is not None else None
        return WorkerRun(tokens=tokens, seconds=seconds, samples=samples, stopped_early=stopped, failed=failed,
                         batches=batches, load=load, worker_pids=self.worker.pids(), disturbed=disturbed,
                         batches_in_flight=in_flight, occupancy=occupancy, thread_cpu=cpu, steady_tok_s=steady,
                         profile=profile, lengths=lengths, cut=cut,
                         scheduler=added_up(scheduler) if scheduler else None)

    def stop(self) -> None:
        self.worker.stop()
