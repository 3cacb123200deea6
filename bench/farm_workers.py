"""bench/farm.py's full path: the run's dataset and submit, real fake-engine worker processes, the
played heartbeat load, and what the ledger says a run did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
from sqlalchemy import text

from bench.farm_services import Farm
from ledger.db import make_engine, make_sessionmaker
from ledger.dispatch import make_celery
from ledger.objects import ObjectStore
from producer.run_config import RunConfig
from producer.submit import submit_run
from worker.batches.ledger_calls import heartbeat
from worker.process import reaper
from worker.process.orphans import LAUNCHER_PID_ENV, die_with_parent
from worker.process.reaper import TAG_ENV

ROOT = Path(__file__).resolve().parents[1]
#: The issue's load per GPU: ~10K output tok/s of 1,500-token samples = 6.7 samples/s, 0.10 commits/s.
SAMPLES_S_PER_GPU = 6.7
#: Fake answers are short (the control plane's load is samples and batches, not tokens); the
#: engine's rate is scaled so each GPU still makes SAMPLES_S_PER_GPU: tok_s = 6.7 x MEAN_TOKENS.
MEAN_TOKENS = 20
#: The run's max_tokens: the issue's cap (32,768) over its mean (1,500), about 22x, kept.
MAX_TOKENS = 22 * MEAN_TOKENS
#: The fake answers are short, so many (~15%) would be stubs (<= 6 tokens) and the gate would pause
#: the run within a minute: nothing is a stub here. The gate still runs (its calls are timed).
QUALITY = {"stub_answer_max_tokens": 0}
#: An H200's max_num_seqs: the engine the tail phase plays, with its derived 122 held batches.
H200_SEQS = 1024
#: Sequences per simulated GPU in the rate windows: a small engine at the same samples/s holds
#: 4 batches (worker/engine/admission.py) and reaches its steady state in ~40 s instead of ~20 min.
WINDOW_SEQS = 16
#: A lone sequence decodes this many times faster than one of a full engine (worker/engine/fake.py
#: ``solo``): a decode step over few sequences is short. ~10x on an H200 (1,024 sequences at ~10 tok/s
#: each, one alone at ~100): without it a run's last sequences would crawl at a full engine's pace.
SOLO = 10
#: Batches an H200 process holds (worker/engine/admission.py batches_to_hold(1024)): the played heartbeat sets.
H200_HELD = 122
HEARTBEAT_S = 5.0
SAMPLES_PER_BATCH = 64
PLAYED_SQL = Path(__file__).with_name("farm_played.sql")


def write_dataset(folder: Path, samples: int) -> Path:
    """``samples`` one-turn prompts of a few bytes (the input shards' size is not what is measured)."""
    path = folder / f"farm-{samples}.jsonl"
    if not path.exists():
        with open(path, "w") as f:
            for i in range(samples):
                f.write(json.dumps({"id": f"s{i}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
    return path


def submit(farm: Farm, dataset: Path, run: str, queue: str) -> tuple[int, float]:
    """Submit ``dataset`` as ``run`` on ``queue`` (directly, not through the pooler: set-up); (run id, seconds)."""
    engine = make_engine(farm.scratch.settings)
    settings = farm.settings
    start = time.perf_counter()
    submit_run(make_sessionmaker(engine), make_celery(settings), ObjectStore.from_settings(settings), [str(dataset)],
               run_name=run, config=RunConfig(model="bench/no-model", max_tokens=MAX_TOKENS,
                                              sampling={"temperature": 1.0}),
               output_url=f"{farm.scratch.output_root}/{run}", batch_size=SAMPLES_PER_BATCH, queue=queue,
               window=settings.queue_window, quality_thresholds=QUALITY,
               benchmark=True)  # served by fake engines, which serve benchmark runs only
    elapsed = time.perf_counter() - start
    with engine.connect() as conn:
        run_id = conn.execute(text("SELECT id FROM runs WHERE name = :n"), {"n": run}).scalar_one()
    engine.dispose()
    return run_id, elapsed


def fake_spec(gpus: int, seqs: int, time_factor: float) -> str:
    tok_s = SAMPLES_S_PER_GPU * MEAN_TOKENS * time_factor
    return f"tok_s={tok_s:g},seqs={seqs},mean={MEAN_TOKENS},sigma=1,gpus={gpus},solo={SOLO}"


@dataclass
class Workers:
    """The bench's worker processes, each in a session of its own that the farm's reaper watches."""

    farm: Farm
    procs: list[subprocess.Popen]
    tags: list[str]
    logs: list[Path]

    def cpu_s(self) -> float:
        total = 0.0
        for p in self.procs:
            try:
                total += sum(psutil.Process(p.pid).cpu_times()[:2])
            except psutil.Error:
                pass
        return total

    def stop(self, timeout_s: float = 90) -> None:
        """SIGTERM (each hands its held batches back), then SIGKILL whatever of its session is left."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p, tag in zip(self.procs, self.tags, strict=True):
            try:
                p.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
            # As the launcher does when a child exits: the rest of its session and its tag, then unwatched.
            reaper.kill(tag, {p.pid})
            self.farm.reaper.forget(p.pid)


def start_workers(farm: Farm, *, queue: str, procs: int, gpus_each: int, seqs: int, time_factor: float,
                  timing_dir: str, tag: str) -> Workers:
    """``procs`` worker processes, supervised as ``regen worker``'s launcher supervises its children.

    Each is started in a new session with PR_SET_PDEATHSIG (SIGTERM: it hands its batches back
    when the bench dies), names the bench as its launcher (worker/process/consumer.py stops when
    that pid is no longer its parent: the instant between fork and prctl), carries the reaper's
    tag and is told to the reaper, which stops whatever of its session is left should the bench
    die by SIGKILL.
    """
    env = farm.env(timing_dir)
    spec = fake_spec(gpus_each, seqs, time_factor)
    workers = Workers(farm, [], [], [])
    for k in range(procs):
        log = Path(farm.scratch.workdir) / f"{tag}-{k}.log"
        child_tag = f"{farm.launch_id}/{tag}{k}"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker.process.consumer", "--name", f"{tag}{k}@farm", "--queues", queue,
                 "--fake-engine", spec, "--loglevel", "WARNING"],
                env={**env, TAG_ENV: child_tag, LAUNCHER_PID_ENV: str(os.getpid())}, stdout=out,
                stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, preexec_fn=die_with_parent)
        farm.reaper.watch(proc.pid)  # its session id
        workers.procs.append(proc)
        workers.tags.append(child_tag)
        workers.logs.append(log)
    return workers


class PlayedHeartbeats:
    """``processes`` GPU processes' heartbeats, each every 5 s over its own ``held`` running batches,
    through the real ``worker.batches.ledger_calls.heartbeat``: the rows are a run of their own (farm_played.sql).

    As with a worker's heartbeat thread, a process beats again only once its last beat has returned:
    a beat due while the last one waits is skipped and counted late (never queued up behind it). A
    ledger that falls behind then shows as late beats and, past the lease, as batches the reconciler
    expired (``lost``, each dropped from its set as a worker drops it), as it would on a farm.
    """

    def __init__(self, farm: Farm, processes: int, held: int = H200_HELD, threads: int = 16):
        self.processes, self.held = processes, held
        self.engine = make_engine(farm.settings, pool_size=threads, max_overflow=0)
        self.sessions = make_sessionmaker(self.engine)
        self.threads = threads
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._beating: set[int] = set()
        self.sent = 0
        self.late = 0
        self.lost = 0
        run_sql, batches_sql = PLAYED_SQL.read_text().split(";\n", 1)
        with self.sessions.begin() as s:
            self.run_id = s.execute(text(run_sql)).scalar_one()
            ids = [r[0] for r in s.execute(text(batches_sql), {"run": self.run_id, "n": processes * held})]
        self.sets = [{b: 1 for b in ids[k * held:(k + 1) * held]} for k in range(processes)]

    def _loop(self) -> None:
        with ThreadPoolExecutor(self.threads) as pool:
            start = time.monotonic()
            k = 0
            while not self._stop.is_set():
                due = start + k * HEARTBEAT_S / self.processes
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                process = k % self.processes
                k += 1
                with self._lock:
                    if process in self._beating:
                        self.late += 1
                        continue
                    self._beating.add(process)
                pool.submit(self._beat, process)
            pool.shutdown(wait=True, cancel_futures=True)

    def _beat(self, process: int) -> None:
        held = self.sets[process]
        try:
            lost = heartbeat(self.sessions, held)
            for batch in lost:
                held.pop(batch, None)
        finally:
            with self._lock:
                self._beating.discard(process)
        with self._lock:
            self.sent += 1
            self.lost += len(lost)

    def words(self) -> str:
        return (f"{self.sent:,} played heartbeat statements, {self.late:,} due while the process's last one had not "
                f"returned (late), {self.lost:,} batches found no longer held (lease expired)")

    def __enter__(self) -> PlayedHeartbeats:
        self._thread = threading.Thread(target=self._loop, name="played-heartbeats", daemon=True)
        if self.processes:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)  # the beats under way return; none waits to start
        with self.sessions.begin() as s:
            # Gone, not left to expire: the reconciler would republish them as lost leases.
            s.execute(text("DELETE FROM runs WHERE id = :r"), {"r": self.run_id})
        self.engine.dispose()


@dataclass
class RunFigures:
    samples_done: int
    batches_done: int
    first_start: float
    last_finish: float
    #: Seconds from the run's first claim until 10%, 90%, 95% and 100% of its samples were done.
    at: dict[int, float]
    completion_tokens: int


def run_figures(farm: Farm, run_id: int) -> RunFigures:
    engine = make_engine(farm.scratch.settings)
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT extract(epoch FROM finished_at), n_samples FROM batches WHERE run_id = :r AND status = 'done' "
            "ORDER BY finished_at"), {"r": run_id}).all()
        first, tokens, total = conn.execute(text(
            "SELECT extract(epoch FROM min(started_at)), coalesce(sum(completion_tokens), 0), sum(n_samples) "
            "FROM batches WHERE run_id = :r"), {"r": run_id}).one()
    engine.dispose()
    at: dict[int, float] = {}
    done = 0
    for finished, n in rows:
        done += n
        for pct in (10, 90, 95, 100):
            if pct not in at and done >= total * pct / 100:
                at[pct] = float(finished) - float(first)
    return RunFigures(samples_done=done, batches_done=len(rows), first_start=float(first or 0),
                      last_finish=float(rows[-1][0]) if rows else 0.0, at=at, completion_tokens=int(tokens))


def batch_states(farm: Farm, run_id: int) -> dict[str, int]:
    """The run's batches by status, read directly (not through the pooler): what the workers had claimed."""
    engine = make_engine(farm.scratch.settings)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM batches WHERE run_id = :r GROUP BY status"),
                            {"r": run_id}).all()
    engine.dispose()
    return {str(status): int(n) for status, n in rows}


def run_finished(farm: Farm, run_id: int) -> tuple[int, int]:
    """(samples done, samples in the run)."""
    engine = make_engine(farm.scratch.settings)
    with engine.connect() as conn:
        done, total = conn.execute(text(
            "SELECT coalesce(sum(n_samples) FILTER (WHERE status = 'done'), 0), sum(n_samples) FROM batches "
            "WHERE run_id = :r"), {"r": run_id}).one()
    engine.dispose()
    return int(done), int(total)
