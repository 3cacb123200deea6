"""regen on GPUs against bare vLLM, on the same requests and engine settings, in one invocation.

    . bench/gpu/unpack.sh                                   # on the GPU machine: vLLM, deps, services
    python -m bench.gpu.throughput --model .gpu-carry/q8b   # one GPU: (a), (b), (c)
    python -m bench.gpu.throughput --model .gpu-carry/q8b --two-gpus   # two GPUs: (b2) with a kill, (t) --tp 2

The phases run one after another, each engine owning the GPU(s) alone (three 8B
engines do not share an H200 without shrinking each one's KV cache):

(a) bare ``LLM.generate`` over every request at once, with vLLM's own offline defaults (on an
    H200 1,024 sequences and 16,384 batched tokens): what a user typing ``LLM(...)`` gets;
(b) the whole system: ``regen submit`` -> Redis -> ``regen worker --gpus all`` with its
    default admission -> S3 (moto) -> Postgres ledger; tokens and the claim-to-commit
    window from the ledger;
(c) the one-batch-at-a-time worker (``--concurrency 1``);
(a2) bare ``LLM.generate`` again, with the engine settings regen chooses for a worker on this
    GPU (worker/engine/host.py's ``engine_defaults``: the admission watermark): how much of (b)'s
    gain over (a) is the settings and how much the system (issue 31). ``--skip a2`` leaves it out.

``--candidate KEY=VALUE`` (repeatable) prices a setting before it becomes regen's default: it
replaces regen's own in (b), (c), (a2) and the estimate, and (a) stays at vLLM's defaults.

At the end, per phase: the roofline bound (bench/gpu/bound.py: bytes and FLOPs) at what the KV cache
holds of this workload and, with ``--engine-stats``, at the phase's measured concurrency, the
phase's share of it, and the seed's 1.37 B output tokens in GPU-hours of the card it ran on (its name
and datasheet bandwidth from bench/gpu/bound.py's CARDS).

With ``--two-gpus``: (b2) ``regen worker --gpus all`` on two GPUs (two processes,
``gpu0@``/``gpu1@``), GPU utilisation sampled, and one worker process SIGKILLed a
third of the way: its batches must come back (lease expiry, reconciler) and every
sample finish exactly once; then (t) one engine over both GPUs (``--tp 2``).

With ``--estimate N``: before (b) (or b2), ``regen estimate`` on a stratified pilot of N
of the same requests (its probe loads its own engine on the GPU, then exits), saved
into (b)'s output prefix; after (b), ``regen estimate --compare b``: estimated against
actual engine-hours and tokens (docs/estimate.md). Where the probe and the run do not fit
one lent machine, ``--probe-results FILE`` splits them: with ``--skip b`` (e) runs alone and
keeps its probe's results in FILE; a later call with the same FILE reuses them and runs (b).

For a diagnosis, the same figures from both phases side by side: ``--engine-stats``
(vLLM's scheduler in (a) and (b): running, waiting, preemptions, KV-cache usage,
prefix-cache hits, and in (b) the requests admitted per window: worker/engine/stats.py)
and ``--py-spy S`` (py-spy profiles of the frontend and the engine-core process over S
seconds of each phase's middle, and a dump of their stacks, into ``--keep-logs``). Every
phase prints its generated output lengths beside the requested ones (bench/lengths.py);
``--ignore-eos`` runs every request to its budget (the dummy weights end early at random).

The model: Qwen3-8B shapes with dummy weights (``load_format=dummy``) over regen's
tiny tokenizer and chat template (bench/gpu/model.py), prompts rendered through the
template as in a real run, output budgets lognormal with a long tail.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from bench.gpu.bound import H200, Card, Shape, bound_line, seed_hours_line, this_card
from bench.gpu.smi import GpuSampler
from bench.lengths import distribution_lines
from bench.prompts import throughput_rows, write_jsonl
from bench.scratch import scratch_services
from bench.system_run import STEADY, SystemUnderTest, WorkerRun, per_sample_budgets
from bench.throughput import BareEngine, _split_cpu_s, engine_args, run_config
from ledger.objects import ObjectStore
from local.services import local_postgres, local_redis
from worker.engine.args import format_engine_args
from worker.engine.host import REGEN_GPU_CHOICES
from worker.engine.sizing import LengthMoments
from worker.engine.stats import STATS_ENV

#: What each phase generated and what vLLM's scheduler did in it, for the side-by-side lines at the end.
DETAILS: dict[str, dict] = {}


class PySpy:
    """py-spy on a phase's frontend and engine-core processes: a profile over ``seconds`` and a stack dump.

    Started ``at`` seconds into the phase (its middle, past the start-up); the profiles are
    speedscope JSON (open in https://www.speedscope.app), ``--idle`` so time a thread
    waits (the GIL, a socket) shows as such; ``--gil`` is left off: a wait for the GIL is
    what is looked for. Needs the py-spy binary (bench/gpu/build_carry.sh carries it).
    """

    def __init__(self, label: str, pids: Callable[[], dict[str, int]], *, at: float, seconds: float, out: Path):
        self.label, self._pids, self.at, self.seconds, self.out = label, pids, at, seconds, out
        self.notes: list[str] = []
        self.binary = shutil.which("py-spy")
        self._thread = threading.Thread(target=self._run, daemon=True)
        #: Set by ``join`` when the phase ended first: a profile not yet started is not started.
        self._cancel = threading.Event()
        self._profiling = threading.Event()

    def start(self) -> PySpy:
        if self.binary is None:
            self.notes.append("py-spy: not found on PATH (build_carry.sh carries it)")
        else:
            self._thread.start()
        return self

    def _run(self) -> None:
        if self._cancel.wait(self.at):
            return
        self._profiling.set()
        try:
            self._profile()
        except Exception as e:  # noqa: BLE001 - a failed profile is reported in the phase's notes, not raised
            self.notes.append(f"py-spy failed: {type(e).__name__}: {e}")

    def _profile(self) -> None:
        procs = []
        pids = self._pids()
        if not pids:
            self.notes.append("py-spy: no process of the phase found to profile")
        for name, pid in pids.items():
            base = self.out / f"pyspy-{self.label}-{name}"
            with open(f"{base}-dump.txt", "w") as dump:
                subprocess.run([self.binary, "dump", "--pid", str(pid)], stdout=dump,
                               stderr=subprocess.STDOUT, timeout=60, check=False)
            procs.append((base, subprocess.Popen(
                [self.binary, "record", "--pid", str(pid), "--duration", str(int(self.seconds)), "--rate", "100",
                 "--idle", "--subprocesses", "--format", "speedscope", "--output", f"{base}.speedscope.json"],
                stdout=subprocess.DEVNULL, stderr=open(f"{base}-record.log", "w"))))
        for base, proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.seconds + 120)
            self.notes.append(f"py-spy {base.name}: rc {proc.returncode}")

    def join(self) -> str:
        """After the phase: a profile under way is waited for (it ends after its seconds), one not begun is not."""
        self._cancel.set()
        if self._profiling.is_set():
            self._thread.join(timeout=self.seconds + 180)
        return "; ".join(self.notes) or "py-spy: the phase ended before its start (--py-spy-at)"


def _engine_cores(root: psutil.Process) -> list[psutil.Process]:
    """vLLM's own processes under ``root`` (it titles them ``VLLM::EngineCore``, ``VLLM::Worker...``)."""
    found = []
    for p in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.name().startswith("VLLM") or "VLLM::" in " ".join(p.cmdline()[:1]):
                found.append(p)
    return found


def _frontends(system: SystemUnderTest) -> list[psutil.Process]:
    """The worker processes of a system phase: the launcher's children that are not vLLM's own."""
    try:
        children = psutil.Process(system.worker.proc.pid).children()
    except psutil.NoSuchProcess:
        return []
    return _worker_children(system) or [p for p in children if p not in _engine_cores_of(children)]


def _engine_cores_of(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.name().startswith("VLLM") or "VLLM::" in " ".join(p.cmdline()[:1]):
                out.append(p)
    return out


def _worker_children(system: SystemUnderTest) -> list[psutil.Process]:
    """The ``python -m worker.process.consumer`` children of the launcher (one per GPU group)."""
    try:
        root = psutil.Process(system.worker.proc.pid)
        # Celery retitles the process once it starts ("[celeryd: gpu0@node:MainProcess] ..."), dropping
        # "worker.process.consumer" from what ps and psutil read as its command line.
        return [p for p in root.children(recursive=True)
                if any(mark in " ".join(p.cmdline()) for mark in ("worker.process.consumer", "[celeryd:"))]
    except psutil.NoSuchProcess:
        return []


def _killer(system: SystemUnderTest, run_name: str, after_batches: int, log: dict) -> threading.Thread:
    """SIGKILL the second worker process once ``after_batches`` batches are done."""
    from sqlalchemy import text

    from ledger.db import make_engine

    done_batches = text("SELECT count(*) FROM batches b JOIN runs r ON r.id = b.run_id "
                        "WHERE r.name = :r AND b.status = 'done'")

    def kill() -> None:
        engine = make_engine(system.scratch.settings)  # one pool for the whole wait, polled once a second
        try:
            while True:
                with engine.connect() as conn:
                    if conn.execute(done_batches, {"r": run_name}).scalar() >= after_batches:
                        break
                time.sleep(1)
        finally:
            engine.dispose()
        children = sorted(_worker_children(system), key=lambda p: " ".join(p.cmdline()))
        victim = next((p for p in children if "gpu1@" in " ".join(p.cmdline())), children[-1] if children else None)
        if victim is None:
            log["error"] = "no worker process to kill"
            return
        log.update(pid=victim.pid, name=next((a for a in victim.cmdline() if "@" in a), "?"), at=time.time())
        victim.send_signal(signal.SIGKILL)
        print(f"   SIGKILL {log['name']} (pid {victim.pid}) after {after_batches} batches were done", flush=True)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def exactly_once(system: SystemUnderTest, run_name: str, expected: int) -> dict:
    """Every sample once in the ledger and once across the run's output shards."""
    from sqlalchemy import text

    from ledger.db import make_engine
    from ledger.shards import decode_shard

    engine = make_engine(system.scratch.settings)
    try:
        with engine.connect() as conn:
            done, distinct = conn.execute(text(
                "SELECT count(*) FILTER (WHERE s.status = 'done'), count(DISTINCT s.sample_id) FROM samples s "
                "JOIN runs r ON r.id = s.run_id WHERE r.name = :r"), {"r": run_name}).one()
            keys = [k for (k,) in conn.execute(text(
                "SELECT b.output_key FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = :r "
                "AND b.status = 'done'"), {"r": run_name})]
            retried = conn.execute(text(
                "SELECT count(*), min(b.started_at) FROM batches b JOIN runs r ON r.id = b.run_id "
                "WHERE r.name = :r AND b.attempts > 1"), {"r": run_name}).one()
    finally:
        engine.dispose()
    # scratch_services already points this process's boto3 at the benchmark's S3.
    store = ObjectStore.from_settings(system.scratch.settings)
    ids = [row["sample_id"] for key in keys for row in decode_shard(store.get(key))]
    return {"expected": expected, "ledger_done": int(done), "ledger_distinct": int(distinct),
            "shard_rows": len(ids), "shard_distinct": len(set(ids)), "batches_retried": int(retried[0]),
            "first_retry_started": retried[1].timestamp() if retried[1] else None}


def steady_note(tok_s: float | None, profile: tuple[float, float, float] | None = None) -> str:
    """The middle of the run's rate (bench/system_run.py steady_tok_s): the ends left out; then its parts."""
    lo, hi = (int(x * 100) for x in STEADY)
    note = f"steady state ({lo}-{hi}% of the run) {tok_s:,.0f} tok/s" if tok_s else "steady state: too few ends"
    if profile:
        note += (f"; ending per second in its first {lo}% / middle / last {100 - hi}%: "
                 + " / ".join(f"{x:,.0f}" for x in profile))
    return note


def line(label: str, what: str, tokens: int, seconds: float, bare_tok_s: float | None, extra: str = "") -> str:
    tok_s = tokens / seconds if seconds else 0.0
    ratio = f"{tok_s / bare_tok_s:.3f}" if bare_tok_s else ("1" if label == "a" else "-")
    return f"| {label} | {what} | {tokens:,} | {seconds:.1f} | {tok_s:,.0f} | {ratio} | {extra} |"


def estimate_phase(args, scratch, jsonl: Path, config, extra: dict, run_name: str) -> None:
    """``regen estimate`` on a pilot of the benchmark's requests, saved where run ``run_name`` will write."""
    from producer.estimate.estimator import estimate, save_estimate
    from producer.estimate.render import render_estimate

    reused = bool(args.probe_results) and Path(args.probe_results).exists()
    print(f"(e) regen estimate on a pilot of {args.estimate:,} of the {run_name!r} run's requests: "
          f"{'reusing the probe of ' + args.probe_results if reused else 'probing'}", flush=True)
    t0 = time.perf_counter()
    with per_sample_budgets():
        doc = estimate([str(jsonl)], config, estimate_options(args, extra))
    url = save_estimate(ObjectStore.from_settings(scratch.settings), f"{scratch.output_root}/{run_name}", doc)
    print(render_estimate(doc))
    how = "the probe reused" if reused else "engine load included"
    kept = f"; the probe's results kept in {args.probe_results}" if args.probe_results and not reused else ""
    print(f"    (e) estimate took {time.perf_counter() - t0:.0f} s ({how}); saved to {url}{kept}", flush=True)
    if args.probe_results and not reused:
        print(f"    (e) {probe_phases(json.loads(Path(args.probe_results).read_text()))}", flush=True)


def probe_phases(probe: dict) -> str:
    """The probe's phases as run, in one line: where its time went, and its rate over the settled phase's
    first half beside the whole (what ``--probe-settled 0.5`` would have measured, on the same engine)."""
    def s(key):
        return "-" if probe.get(key) is None else f"{probe[key]:,.1f} s"

    rate, half = probe.get("tokens_per_s"), probe.get("settled_first_half_tokens_per_s")
    ratio = f" ({half / rate:.3f} of it)" if rate and half else ""
    return (f"probe phases: load {s('load_s')}, samples {s('samples_phase_s')}, settled {s('settled_phase_s')} "
            f"(share {probe.get('settled_share')}), drain {s('drain_s')} ({probe.get('drain_unstarted_aborted')} "
            f"unstarted dropped; {s('drain_loss_s')} lost); rate {rate or 0:,.0f} tok/s over the settled phase, "
            f"{half or 0:,.0f} over its first half{ratio}")


def estimate_options(args, extra: dict):
    """regen estimate's options for (e): the workers' engine arguments, one engine, and ``--probe-results``.

    ``--probe-results FILE`` splits (e) from the run it prices where both do not fit one lent machine
    (the 32B long workload: a probe of ~25-30 minutes, then the run): a first call writes the probe's
    results there (``--skip b``: (e) alone), a later one reuses them (no probe engine) and runs (b).
    The estimate refuses a file of another sample (its sample ids are checked).
    """
    from producer.estimate.estimator import EstimateOptions, ThroughputChoice

    return EstimateOptions(sample_size=args.estimate, engines=1, throughput=ThroughputChoice(),
                           engine_args=tuple(format_engine_args(extra)), probe_results=args.probe_results,
                           settled_share=args.probe_settled)


def compare_phase(scratch, run_name: str) -> None:
    """``regen estimate --compare`` of the run: the saved estimate beside the ledger's actuals."""
    from producer.estimate.command import compare_run
    from producer.estimate.render import render_compare

    result = compare_run(scratch.settings, run_name)
    print(render_compare(result), flush=True)
    for row in result["rows"]:
        if row["metric"] in ("output tokens", "engine-hours") and row["error"] is not None:
            print(f"    (e) {row['metric']}: estimate {row['error']:+.1%} against actual (goal ±10%)", flush=True)


def _spy(args, label: str, pids: Callable[[], dict[str, int]]) -> PySpy | None:
    if not args.py_spy:
        return None
    out = Path(args.keep_logs or tempfile.gettempdir())
    return PySpy(label, pids, at=args.py_spy_at, seconds=args.py_spy, out=out).start()


def bare_phase(args, model: str, settings: dict, rows: list[dict], config,
               label: str = "a") -> tuple[str, str, int, float, str]:
    what = BARE_WHAT[label]
    print(f"({label}) {what}: loading", flush=True)
    t0 = time.perf_counter()
    bare = BareEngine(model, settings)
    prompts, params = bare.requests(rows, config.as_record())
    bare.run("warm-up", prompts[:64], params[:64])
    sched = bare.llm.llm_engine.vllm_config.scheduler_config
    kv_tokens = bare.kv_tokens
    print(f"    loaded and warmed up in {time.perf_counter() - t0:.0f} s; max_num_seqs {sched.max_num_seqs}, "
          f"batched tokens {sched.max_num_batched_tokens}, KV cache {kv_tokens:,} tokens", flush=True)
    cpu0 = sum(psutil.Process().cpu_times()[:2])
    spy = _spy(args, "a", lambda: {"frontend": os.getpid(),
                                   **{f"enginecore{i}": p.pid for i, p in enumerate(_engine_cores(psutil.Process()))}})
    with GpuSampler() as gpu:
        m = bare.run(label, prompts, params)
    cpu = sum(psutil.Process().cpu_times()[:2]) - cpu0
    bare.shutdown()
    notes = (f"max_num_seqs {sched.max_num_seqs}; frontend {cpu / max(1, m.tokens) * 1000:.4f} CPU-s per 1K tokens; "
             f"{gpu.summary()}; {steady_note(m.steady_tok_s, m.profile)}" + (f"; {spy.join()}" if spy else ""))
    DETAILS[label] = {"lengths": m.lengths, "cut": m.cut, "scheduler": m.scheduler, "kv_tokens": kv_tokens,
                      "max_num_seqs": sched.max_num_seqs,
                      "moments": LengthMoments.of((len(x["prompt_token_ids"]) for x in prompts),
                                                  (sp.max_tokens for sp in params)),
                      "tok_s": m.tok_s, "steady": m.steady_tok_s}
    print(f"    ({label}) {m.tokens:,} tokens in {m.seconds:.1f} s = {m.tok_s:,.0f} tok/s", flush=True)
    return label, what, m.tokens, m.seconds, notes


#: The bare phases: vLLM's defaults, and the same engine with the settings regen chooses.
BARE_WHAT = {"a": "bare LLM.generate, all requests at once, vLLM's defaults",
             "a2": "bare LLM.generate, all requests at once, regen's engine settings"}


def vllm_defaults(settings: dict, user: dict, *, on_cpu: bool) -> dict:
    """(a)'s settings: the worker's, less what regen chooses on GPUs unless the user set it too.

    On the CPU regen's settings are what the CPU build needs to run at all (worker/engine/host.py),
    so (a) keeps them."""
    if on_cpu:
        return dict(settings)
    # kv_transfer_config: regen's offload_prompt_only where the user asked for a CPU tier (worker/engine/kv_tier.py);
    # (a) builds the tier as vLLM would from the user's words.
    regen_chose = {*REGEN_GPU_CHOICES, "kv_transfer_config"}
    return {k: v for k, v in settings.items() if k not in regen_chose or k in user}


def worker_kv_tokens(log: str) -> int:
    """The KV cache a worker's engine was built with, from its "engine ready" line (0 if it has none)."""
    m = re.search(r"engine ready: .*?KV cache (\d+) tokens", log)
    return int(m.group(1)) if m else 0


def worker_max_num_seqs(log: str) -> int:
    """The most sequences a worker's engine runs at once, from its "engine ready" line (0 if it has none)."""
    m = re.search(r"engine ready: .*?max_num_seqs (\d+)", log)
    return int(m.group(1)) if m else 0


def phase_settings(engine_arg: list[str], candidate: list[str], *, on_cpu: bool) -> tuple[dict, dict, dict]:
    """The workers' extra engine args, the settings of regen's phases, and (a)'s.

    ``--engine-arg`` reaches every engine; a ``--candidate`` only regen's phases, over regen's own
    default, so (a) stays at vLLM's defaults and the one invocation's ratio prices the candidate."""
    from worker.engine.args import parse_engine_args

    user = parse_engine_args(engine_arg)
    common = {"max_model_len": 8192, **({} if on_cpu else {"load_format": "dummy"}), **user}
    extra = {**common, **parse_engine_args(candidate)}
    return extra, engine_args(extra, on_cpu=on_cpu), vllm_defaults(engine_args(common, on_cpu=on_cpu), user,
                                                                   on_cpu=on_cpu)


def bound_lines(model: str, details: dict[str, dict], rates: dict[str, float], *, card: Card = H200) -> list[str]:
    """Per phase: the roofline bound (bytes and FLOPs) on ``card`` at its measured concurrency (--engine-stats), and at what its
    cache holds; the seed's corpus in that card's hours.

    Each phase is bounded by its own engine's cache: regen's 0.95 of the card builds a larger one than
    vLLM's 0.92 (worker/engine/gpu_memory.py). A phase whose cache is unknown gets no capacity line,
    never another phase's."""
    shape = Shape.from_config(model)
    lines = ["", f"the roofline bound (bench/gpu/bound.py: bytes and FLOPs): {shape.params / 1e9:.1f} B parameters, "
                 f"{shape.weight_bytes / 1e9:.1f} GB of weights and {shape.kv_bytes_per_token / 1024:.0f} KiB of KV "
                 "a token read per decode step"]
    moments = next((d["moments"] for d in details.values() if d.get("moments") is not None), None)
    if moments is None:
        lines.append("the cache's capacity: not known (the workload's footprint comes from a bare phase's "
                     "rendered prompts, (a) or (a2), and none ran)")
    else:
        lines.append(f"workload: a request in the engine holds ~{moments.footprint():,.0f} tokens of cache "
                     "(length-biased)")
    for label, tok_s in rates.items() if moments is not None else ():
        kv = details.get(label, {}).get("kv_tokens") or 0
        if not kv:
            lines.append(f"({label}) at the cache's capacity: not known (its engine did not report its KV cache)")
            continue
        fits = kv / moments.footprint()
        # The engine runs at most max_num_seqs at once, however many the cache would hold (a short workload's
        # 1,024 where the cache holds ~2,000): the bound is at the concurrency it can reach.
        cap = details.get(label, {}).get("max_num_seqs") or 0
        running = min(fits, cap) if cap else fits
        held = (f"{kv:,} tokens hold ~{fits:.0f} of them" +
                (f"; max_num_seqs {cap} runs {running:.0f}" if cap and cap < fits else ""))
        lines.append(f"({label}) at the cache's capacity ({held}): "
                     f"{bound_line(shape, running, running * moments.footprint(), tok_s, card=card)}")
    for label, tok_s in rates.items():
        sched = details.get(label, {}).get("scheduler")
        kv = details.get(label, {}).get("kv_tokens") or 0
        if sched is not None and getattr(sched, "steps", 0) and kv:
            running, used = sched.running / sched.steps, sched.kv / sched.steps
            lines.append(f"({label}) at its measured concurrency: {bound_line(shape, running, used * kv, tok_s, card=card)}")
    for label, tok_s in rates.items():
        lines.append(f"({label}) {seed_hours_line(tok_s, card=card)}")
    return lines


def system_phase(args, scratch, jsonl: Path, rows: list[dict], config, extra: dict, label: str, k: int, tp: int,
                 processes: int) -> tuple[str, str, int, float, str]:
    what = {"b": "whole system, regen worker, regen's defaults",
            "c": "one batch at a time, --concurrency 1" + (
                f", the first {len(rows):,} requests" if label == "c" and len(rows) < args.prompts else ""),
            "b2": "whole system on 2 GPUs (gpu0@, gpu1@), one SIGKILLed mid-run",
            "t": "whole system, one engine over 2 GPUs, --tp 2"}[label]
    print(f"({label}) {what}: starting the worker", flush=True)
    t0 = time.perf_counter()
    system = SystemUnderTest(scratch, model=args.model, jsonl=jsonl, config=config, concurrency=k,
                             batch_size=args.batch_size, engine_args=extra, label=label, gpus=args.gpus, tp=tp,
                             processes=processes, reconcile_s=10 if label == "b2" else 0)
    try:
        system.wait_ready()
        print(f"    ready (engine loaded, warm-up run done) in {time.perf_counter() - t0:.0f} s", flush=True)
        pids = system.worker.pids()
        before = _split_cpu_s(pids)
        kill_log: dict = {}
        batches = -(-len(rows) // args.batch_size)
        if label == "b2":
            _killer(system, label, max(1, batches // 3), kill_log)
        spy = _spy(args, label, lambda: {
            **{f"worker{i}": p.pid for i, p in enumerate(_frontends(system))},
            **{f"enginecore{i}": p.pid for i, p in enumerate(
                c for w in _frontends(system) for c in _engine_cores(w))}})
        with GpuSampler() as gpu:
            result: WorkerRun = system.run(label)
        log = system.worker.log_tail(10**9)
        DETAILS[label] = {"lengths": result.lengths, "cut": result.cut, "scheduler": result.scheduler,
                          "kv_tokens": worker_kv_tokens(log), "max_num_seqs": worker_max_num_seqs(log)}
        after = _split_cpu_s(pids | system.worker.pids())
        frontend_cpu = after[1] - before[1]
        notes = (f"{steady_note(result.steady_tok_s, result.profile)}; "
                 f"{result.batches_in_flight:.1f} batches in flight on average; worker frontend "
                 f"{frontend_cpu / max(1, result.tokens) * 1000:.4f} CPU-s per 1K tokens; {gpu.summary()}; "
                 f"{result.occupancy_note()}; {result.thread_cpu_note()}" + (f"; {spy.join()}" if spy else ""))
        if label == "b2":
            check = exactly_once(system, label, len(rows))
            back = (check["first_retry_started"] - kill_log["at"]) if check["first_retry_started"] and \
                kill_log.get("at") else None
            killed = (f"killed {kill_log['name']}" if "at" in kill_log
                      else "NO KILL (the run finished before a third of its batches was seen done)")
            notes += (f"; {killed}: {check['batches_retried']} batches taken again"
                      + (f", the first {back:.0f} s after the kill" if back is not None else "")
                      + f"; samples done {check['ledger_done']}/{check['expected']} (distinct "
                      f"{check['ledger_distinct']}), shard rows {check['shard_rows']} (distinct "
                      f"{check['shard_distinct']}); LOST {check['expected'] - check['shard_distinct']}, "
                      f"DOUBLED {check['shard_rows'] - check['shard_distinct']}")
        print(f"    ({label}) {result.tokens:,} tokens in {result.seconds:.1f} s = "
              f"{result.tokens / result.seconds:,.0f} tok/s; {notes}", flush=True)
        return label, what, result.tokens, result.seconds, notes
    except Exception:
        print(f"    worker log (last 6000 characters):\n{system.worker.log_tail(6000)}", flush=True)
        raise
    finally:
        system.stop()
        if args.keep_logs and system.worker.log_path.exists():
            shutil.copy(system.worker.log_path, Path(args.keep_logs) / f"worker-{label}.log")
        time.sleep(5)


def side_by_side(requested: list[int], details: dict[str, dict]) -> list[str]:
    """Each phase's generated lengths beside the requested, then each phase's scheduler, (a) first."""
    order = sorted(details, key=lambda label: label != "a")
    lines = [""] + distribution_lines(requested, {k: (details[k]["lengths"], details[k]["cut"])
                                                  for k in order if details[k]["lengths"]})
    sched = [k for k in order if details[k]["scheduler"] is not None]
    if sched:
        lines += ["", f"vLLM's scheduler over each phase ({STATS_ENV}=1, worker/engine/stats.py):"]
        lines += [f"({k}) {details[k]['scheduler'].describe()}" for k in sched]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model directory (bench/gpu/model.py builds the 8B-shaped one)")
    p.add_argument("--prompts", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--mean-tokens", type=float, default=400.0, help="mean of the lognormal output budget")
    p.add_argument("--max-tokens", type=int, default=4096, help="cap of the output budget (the run's max_tokens)")
    p.add_argument("--engine-arg", action="append", default=[], help="for every engine, (a) and the workers alike")
    p.add_argument("--candidate", action="append", default=[], metavar="KEY=VALUE",
                   help="an engine arg for regen's phases only ((b), (c), (a2), (e)), over regen's default: a "
                        "candidate default, priced against (a) at vLLM's defaults in the same invocation")
    p.add_argument("--skip", default="",
                   help="phases to skip, comma-separated, e.g. c or a,c (b,c: bare alone, in a call of its own)")
    p.add_argument("--keep-logs", default=os.environ.get("OUT"), help="copy each worker's log here (default: $OUT)")
    p.add_argument("--two-gpus", action="store_true", help="the two-GPU phases (b2 with a kill, t with --tp 2)")
    p.add_argument("--c-prompts", type=int, default=512, metavar="N",
                   help="(c) runs over the first N requests only (0: all): one batch at a time, the whole "
                        "workload would take an hour; its rate is still set beside (a)'s")
    p.add_argument("--estimate", type=int, default=0, metavar="N",
                   help="regen estimate on a pilot of N requests before (b), compared with (b) after it")
    p.add_argument("--probe-results", default=None, metavar="FILE",
                   help="(e)'s probe results: reused if FILE exists (no probe engine), else written there; with "
                        "--skip b, (e) runs alone (the probe in one call, the run it prices in a later one)")
    p.add_argument("--probe-settled", type=float, default=None, metavar="SHARE",
                   help="(e): regen estimate's --probe-settled, the probe's settled phase over its samples' "
                        "(default: as long again; 0.5 fits the 32B probe into one lent machine)")
    p.add_argument("--gpus", default="all", help="the workers' --gpus (none: a CPU smoke run of this script)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every request runs to its budget, in every phase (vLLM's ignore_eos in the run's record): "
                        "the dummy weights otherwise end early at random")
    p.add_argument("--engine-stats", action="store_true",
                   help=f"vLLM's scheduler stats in every phase, side by side at the end ({STATS_ENV}=1; they cost "
                        "the engine a little, so not for the figures of record)")
    p.add_argument("--py-spy", type=float, default=0, metavar="S",
                   help="py-spy profiles of each phase's frontend and engine core over S seconds, into --keep-logs")
    p.add_argument("--py-spy-at", type=float, default=60, metavar="S",
                   help="seconds into each phase the py-spy profile starts (default 60: past the start-up)")
    args = p.parse_args(argv)
    if args.engine_stats:
        os.environ[STATS_ENV] = "1"  # the bare engine here and, through the environment, every worker
    started = time.perf_counter()
    on_cpu = args.gpus == "none"
    extra, settings, bare_settings = phase_settings(args.engine_arg, args.candidate, on_cpu=on_cpu)
    rows = throughput_rows(args.prompts, seed=0, mean_tokens=args.mean_tokens, max_tokens=args.max_tokens)
    budgets = [r["max_tokens"] for r in rows]
    config = run_config(args.model, args.max_tokens, ignore_eos=args.ignore_eos)
    print(f"workload: {len(rows):,} single-turn prompts rendered with the chat template (thinking on); output "
          f"budgets lognormal: mean {statistics.mean(budgets):.0f}, median {statistics.median(budgets):.0f}, "
          f"max {max(budgets)}; batches of {args.batch_size}; ignore_eos "
          f"{'on' if args.ignore_eos else 'off (the dummy weights end early at random; --ignore-eos)'}")
    print(f"engine settings of (b), (c), (a2) (regen's defaults + the benchmark's"
          f"{' + the candidate' if args.candidate else ''}): {json.dumps(settings)}; "
          f"of (a) (vLLM's defaults + the benchmark's): {json.dumps(bare_settings)}", flush=True)
    results: list[tuple[str, str, int, float, str]] = []  # label, what, tokens, seconds, notes
    with tempfile.TemporaryDirectory(prefix="regen-gpu-bench-") as work, \
            local_postgres(Path(work)) as (admin_dsn, _), local_redis() as (redis_url, _), \
            scratch_services(admin_dsn=admin_dsn, redis_url=redis_url) as scratch:
        jsonl = Path(scratch.workdir) / "prompts.jsonl"
        write_jsonl(jsonl, rows)
        skip = set(args.skip.split(","))
        if args.two_gpus:
            phases = [("b2", 0, 1, 2 if not on_cpu else 1)] + ([] if "t" in skip else [("t", 0, 2, 1)])
        else:
            phases = ([] if "b" in skip else [("b", 0, 1, 1)]) + ([] if "c" in skip else [("c", 1, 1, 1)])
        # The system first, bare last: a failed system phase still leaves the bare figure, and the
        # GPU is dedicated, so the order does not drift as the shared CPU machine does.
        for label, k, tp, processes in phases:
            estimated = False
            if args.estimate and label in ("b", "b2"):
                try:
                    estimate_phase(args, scratch, jsonl, config, extra, label)
                    estimated = True
                except Exception as e:  # noqa: BLE001 - report it and go on with the run
                    print(f"(e) FAILED: {type(e).__name__}: {str(e)[-3000:]}", flush=True)
            phase_jsonl, phase_rows = jsonl, rows
            if label == "c" and 0 < args.c_prompts < len(rows):
                phase_rows = rows[:args.c_prompts]
                phase_jsonl = Path(scratch.workdir) / "prompts-c.jsonl"
                write_jsonl(phase_jsonl, phase_rows)
            try:
                results.append(system_phase(args, scratch, phase_jsonl, phase_rows, config, extra, label, k, tp,
                                            processes))
                if estimated:
                    compare_phase(scratch, label)
            except Exception as e:  # noqa: BLE001 - report it and go on to the next phase
                print(f"({label}) FAILED: {type(e).__name__}: {str(e)[-3000:]}", flush=True)
        if args.estimate and "b" in skip and not args.two_gpus:
            # (e) alone: a probe whose run does not fit the same machine (--probe-results keeps it).
            estimate_phase(args, scratch, jsonl, config, extra, "b")
        if not args.two_gpus and "a" not in skip:
            results.append(bare_phase(args, args.model, bare_settings, rows, config))
        if not args.two_gpus and "a2" not in skip and bare_settings != settings:
            results.append(bare_phase(args, args.model, settings, rows, config, label="a2"))
    bare_tok_s = next((tokens / seconds for label, _, tokens, seconds, _ in results if label == "a"), None)
    table = ["", "| run | what | output tokens | seconds | tokens/s | / (a) | notes |", "|---|---|---:|---:|---:|---:|---|"]
    for label, what, tokens, seconds, notes in sorted(results, key=lambda r: (r[0] != "a", r[0] != "a2")):
        table.append(line(label, what, tokens, seconds, None if label == "a" else bare_tok_s, notes))
    print("\n".join(table))
    print("\n".join(side_by_side([r["max_tokens"] for r in rows], DETAILS)))
    if not on_cpu:
        print("\n".join(bound_lines(args.model, DETAILS, {label: tokens / seconds for label, _, tokens, seconds, _
                                                           in results if seconds}, card=this_card())))
    print(f"\nwall time of the whole benchmark: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
