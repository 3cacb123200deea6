"""Is the engine saturated? Output tokens/s of bare vLLM, of the whole system, and of one batch at a time.

    python -m bench.throughput                 # 2,048 prompts, batches of 64, K=24, 2 cycles
    python -m bench.throughput --prompts 512 --cycles 1 --concurrency 16 --batch-size 32

Every engine (the bare one and one worker per configuration) loads once, at the same
time, and stays up; a run's wall time is then the engine loads plus 2 x cycles + 1 runs.

One invocation, the same prompts, the same sampling and the same engine settings:

(a) bare vLLM: ``LLM.generate`` over every prompt at once, the ceiling. Run first and
    after every system run (a, b, a, c, a, b, a, c, a with ``--cycles 2``); each system
    run is compared with the bare runs just before and after it, because this shared
    machine drifts by tens of percent within minutes.
(b) the whole system: submit -> Redis -> ``regen worker --concurrency K`` -> S3 (a
    moto server) -> ledger (a scratch Postgres database). Tokens come from the ledger;
    the window runs from the first claim (``min(started_at)``) to the last commit
    (``max(finished_at)``), so the engine load is not counted.
(c) the one-batch-at-a-time worker (``--concurrency 1``), the baseline.

Prompts and sampling are built exactly as the worker builds them (its Renderer and
``engine_sampling``, from the run's record), so (a) generates the very requests (b)
does. Output lengths: every row carries its own ``max_tokens`` drawn from a capped
lognormal (bench/prompts.py); random weights rarely stop on their own, and with
``--ignore-eos`` never (the run's record carries ``ignore_eos``, which the worker passes
to vLLM, as (a) does): every request then runs to its budget. Each phase's generated
lengths are printed beside the requested ones (bench/lengths.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.lengths import distribution_lines
from bench.prompts import throughput_rows, write_jsonl
from bench.scratch import DEFAULT_ADMIN_DSN, DEFAULT_REDIS_URL, scratch_services
from bench.system_run import SystemUnderTest, WorkerRun, run_profile, steady_tok_s

#: Engine settings of both (a) and the worker, on top of worker/engine/host.py's engine_defaults
#: (on the CPU: 256 sequences, 8,192 batched tokens, no chunked prefill).
BENCH_ENGINE_ARGS = {"max_model_len": 4096}
#: KV cache of each CPU engine, GiB: 256 sequences x 1.5K tokens of the tiny model need ~0.2.
KV_CACHE_GIB = "1"


@dataclass
class Measurement:
    label: str
    what: str
    tokens: int
    seconds: float
    requests: int
    stopped_early: int
    load: float
    #: CPU seconds of the engine's own processes (EngineCore and its worker) during the run,
    #: and of everything else of that system (the benchmark process for (a); the launcher and
    #: the Celery worker process for (b)/(c)): what the frontend cost besides the model.
    engine_cpu_s: float = 0.0
    frontend_cpu_s: float = 0.0
    #: Tokens per second over the middle of the run (bench/system_run.py ``steady_tok_s``).
    steady_tok_s: float | None = None
    #: ... over its first part, middle and last part (bench/system_run.py ``run_profile``).
    profile: tuple[float, float, float] | None = None
    #: Output tokens of each request, and how many ended at their budget (finish reason ``length``).
    lengths: list[int] | None = None
    cut: int = 0
    #: vLLM's scheduler over the run (worker/engine/stats.py), where stats were on.
    scheduler: object | None = None

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _load() -> float:
    return os.getloadavg()[0]


def engine_args(extra: dict | None = None, *, on_cpu: bool = True) -> dict:
    """What the worker's engine is built with: regen's defaults for the platform, then the benchmark's."""
    from worker.engine.host import chosen_engine_args

    return chosen_engine_args(on_cpu, {**BENCH_ENGINE_ARGS, **(extra or {})})


def tiny_bench_model() -> str:
    """The random-weight tiny model every CPU benchmark uses by default, built once per build key."""
    from worker.tiny.model import build_key, build_tiny_model

    # One folder per build key: a changed tiny_model.py builds beside the old one, never over it.
    folder = Path("/tmp/regen-bench-model") / f"tiny-random-{build_key('random', 0)[:12]}"
    return str(build_tiny_model(folder, variant="random"))


def run_config(model: str, max_tokens: int, *, ignore_eos: bool = False):
    """The run every system run uses; (a) derives its requests from the same record.

    ``ignore_eos``: a benchmark-only setting (no regen command sets it), in the run's
    record, so the worker and (a) alike run every request to its budget.
    """
    from dataclasses import replace

    from producer.run_config import build_run_config

    config = build_run_config(model, max_tokens=max_tokens, seed=0, thinking="on")
    if ignore_eos:
        config = replace(config, sampling={**config.sampling, "ignore_eos": True})
    return config


class BareEngine:
    """(a): vLLM's offline ``LLM`` with the worker's engine settings, over the worker's exact requests."""

    def __init__(self, model: str, settings: dict | None = None):
        from vllm import LLM

        from worker.engine.stats import attach_to_llm, stats_wanted

        settings = dict(settings if settings is not None else engine_args())
        if stats_wanted():
            settings["disable_log_stats"] = False  # the scheduler's stats, as the worker then records them
        self.llm = LLM(model=model, **settings)
        #: vLLM's scheduler stats over each run (REGEN_ENGINE_STATS=1), else None.
        self.stats = attach_to_llm(self.llm) if stats_wanted() else None

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds, as vLLM sized it: what the worker reads of its own (worker/engine/host.py)."""
        from worker.engine.cache_plan import engine_capacity

        config = self.llm.llm_engine.vllm_config
        return engine_capacity(config, config.model_config.max_model_len).tokens

    def requests(self, rows: list[dict], run_sampling: dict) -> tuple[list[dict], list]:
        from transformers import AutoTokenizer
        from vllm import SamplingParams

        from ledger.hashing import sample_seed, thinking_enabled
        from producer.dataset.normalize import normalize_row
        from worker.conversation.generation import engine_sampling
        from worker.conversation.rendering import Renderer

        max_model_len = self.llm.llm_engine.model_config.max_model_len
        renderer = Renderer(AutoTokenizer.from_pretrained(self.llm.llm_engine.model_config.model), max_model_len)
        prompts, params = [], []
        for row in rows:
            sample = normalize_row(row)  # the sample id and messages exactly as submit makes them
            sid = sample["sample_id"]
            thinking = thinking_enabled(run_sampling.get("thinking", "on"),
                                        float(run_sampling.get("thinking_off_share", 0.0)), sid)
            ids = renderer.render(sample["messages"], sample["tools"], thinking=thinking)
            budget = min(int(run_sampling["max_tokens"]), int(row["max_tokens"]))
            sampling = engine_sampling(run_sampling, seed=sample_seed(int(run_sampling.get("seed", 0)), sid, 0),
                                       max_tokens=max(1, min(budget, max_model_len - len(ids))))
            prompts.append({"prompt_token_ids": ids})
            params.append(SamplingParams(**sampling))
        return prompts, params

    def run(self, label: str, prompts: list[dict], params: list) -> Measurement:
        load = _load()
        finished: list[tuple[float, int]] = []
        engine = self.llm.llm_engine
        step = engine.step

        def timed_step():
            # LLM.generate's loop (0.26 and 0.32 alike) calls llm_engine.step(); each finished
            # request's end is noted for the steady-state rate, at the cost of a clock read a step.
            outputs = step()
            now = time.time()
            finished.extend((now, len(o.outputs[0].token_ids)) for o in outputs if getattr(o, "finished", False))
            return outputs

        engine.step = timed_step
        if self.stats is not None:
            self.stats.reset()
        start, wall0 = time.perf_counter(), time.time()
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        finally:
            del engine.step
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        stopped = sum(o.outputs[0].finish_reason == "stop" for o in outputs)
        lengths = [len(o.outputs[0].token_ids) for o in outputs]
        cut = sum(o.outputs[0].finish_reason == "length" for o in outputs)
        steady = steady_tok_s(finished, wall0, wall0 + seconds)
        # Too few ends for a steady state are too few for the parts too.
        profile = run_profile(wall0, wall0 + seconds, finished=finished) if steady is not None else None
        return Measurement(label, "bare LLM.generate, all prompts at once", tokens, seconds, len(outputs),
                           stopped, load, steady_tok_s=steady, profile=profile, lengths=lengths, cut=cut,
                           scheduler=self.stats.total() if self.stats is not None else None)

    def shutdown(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            engine.engine_core.shutdown()


def kv_capacity_note(llm, params: list) -> str:
    """How many of this workload's sequences the engine's KV cache holds at once, against max_num_seqs."""
    cache = llm.llm_engine.vllm_config.cache_config
    blocks, block = int(cache.num_gpu_blocks or 0), int(cache.block_size)
    seqs = llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
    mean_len = statistics.fmean(p.max_tokens for p in params) if params else 0
    fits = blocks * block / mean_len if mean_len else 0
    limit = "the KV cache" if fits < seqs else "max_num_seqs"
    return (f"KV cache: {blocks:,} blocks of {block} = {blocks * block:,} tokens, ~{fits:,.0f} sequences of the "
            f"mean budget ({mean_len:,.0f} output tokens, prompts not counted) against max_num_seqs {seqs}: "
            f"{limit} limits the engine")


def _split_cpu_s(pids: set[int]) -> tuple[float, float]:
    """(engine, frontend) CPU seconds so far of these processes; vLLM names its own ``VLLM::...``."""
    engine = frontend = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(pid)
            used = sum(proc.cpu_times()[:2])
            if proc.name().startswith("VLLM") or "VLLM::" in " ".join(proc.cmdline()[:1]):
                engine += used
            else:
                frontend += used
    return engine, frontend


def _cpu_s(pids: set[int]) -> float:
    """CPU seconds used so far by these processes, engine and frontend together."""
    return sum(_split_cpu_s(pids))


def system_measurement(label: str, what: str, result: WorkerRun) -> Measurement:
    what += (f", {result.batches} batches, {result.batches_in_flight:.1f} in flight on average; "
             f"{result.occupancy_note()}; {result.thread_cpu_note()}")
    if result.disturbed:
        what += " (DISTURBED: Postgres was restarted during the run)"
    return Measurement(label, what, result.tokens, result.seconds, result.samples, result.stopped_early,
                       result.load, steady_tok_s=result.steady_tok_s, profile=result.profile,
                       lengths=result.lengths, cut=result.cut, scheduler=result.scheduler)


def report(measurements: list[Measurement], *, idle_cpu_s: float, requested: list[int] | None = None) -> str:
    bare = [m for m in measurements if m.label.startswith("a")]
    median = statistics.median(m.tok_s for m in bare)
    lines = [
        "",
        "| run | what | requests | output tokens | seconds | tokens/s | steady tok/s (20-80%) "
        "| ending per s in 0-20 / 20-80 / 80-100% | / bare median | CPU-s engine / frontend | load avg (1 min) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in measurements:
        steady = f"{m.steady_tok_s:,.0f}" if m.steady_tok_s else "-"
        parts = " / ".join(f"{x:,.0f}" for x in m.profile) if m.profile else "-"
        lines.append(f"| {m.label} | {m.what} | {m.requests:,} | {m.tokens:,} | {m.seconds:.1f} | {m.tok_s:,.0f} "
                     f"| {steady} | {parts} | {m.tok_s / median:.2f} | {m.engine_cpu_s:.0f} / {m.frontend_cpu_s:.0f} "
                     f"| {m.load:.1f} |")
    low, high = min(m.tok_s for m in bare), max(m.tok_s for m in bare)
    lines += ["", f"(a) bare: median {median:,.0f} tok/s over {len(bare)} runs, spread {low:,.0f}-{high:,.0f} "
                  f"({(high - low) / median * 100:.0f}% of the median)"]
    for kind in ("b", "c"):
        runs = [(i, m) for i, m in enumerate(measurements) if m.label.startswith(kind)]
        if not runs:
            continue
        # Against the bare runs just before and after each system run: what the machine gave
        # at that time (it drifts by tens of percent here); the median over repeats.
        paired = [m.tok_s / statistics.mean(x.tok_s for x in (measurements[i - 1], measurements[i + 1]))
                  for i, m in runs]
        own = statistics.median(m.tok_s for _, m in runs)
        lines.append(f"({kind}) / (a) = {statistics.median(paired):.3f} against the neighbouring bare runs "
                     f"(each: {', '.join(f'{r:.3f}' for r in paired)}); {own / median:.3f} median against "
                     f"median   [{runs[0][1].what.split(',')[0]}, {own:,.0f} tok/s]")
    firsts = {}
    for m in measurements:  # every run of a kind generates the same requests: its first speaks for it
        if m.lengths and m.label[0] not in firsts:
            firsts[m.label[0]] = m
    if firsts and requested:
        lines += [""] + distribution_lines(requested, {k: (m.lengths, m.cut) for k, m in firsts.items()})
    sched = [m for m in measurements if m.scheduler is not None]
    if sched:
        lines += ["", "vLLM's scheduler over each run (REGEN_ENGINE_STATS=1; worker/engine/stats.py):"]
        lines += [f"({m.label}) {m.scheduler.describe()}" for m in sched]
    stops = sum(m.stopped_early for m in measurements)
    total_s = sum(m.seconds for m in measurements)
    lines.append(f"requests that stopped before their max_tokens (EOS): {stops} of "
                 f"{sum(m.requests for m in measurements)}; the idle engines used {idle_cpu_s:.1f} CPU-s while "
                 f"another was measured ({idle_cpu_s / total_s * 100:.1f}% of one core)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=0, help="K: batches the worker holds in the system run (b); "
                   "0 (the default): the worker's own choice, from its engine's max_num_seqs")
    p.add_argument("--mean-tokens", type=float, default=200.0, help="mean of the lognormal output budget")
    p.add_argument("--max-tokens", type=int, default=1400, help="cap of the output budget (the run's max_tokens)")
    p.add_argument("--cycles", type=int, default=2, help="repeats of b, a, c, a after the first bare run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="model directory (default: build the tiny random model)")
    p.add_argument("--no-baseline", action="store_true", help="skip (c), the one-batch-at-a-time worker")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every request runs to its budget, in (a) and the workers alike (vLLM's ignore_eos, "
                        "carried in the run's record): the workload is then exactly the requested lengths")
    p.add_argument("--engine-arg", action="append", default=[],
                   help="vLLM engine argument key=value for every engine, (a) and the workers alike (repeatable)")
    p.add_argument("--admin-dsn", default=os.environ.get("REGEN_BENCH_PG", DEFAULT_ADMIN_DSN))
    p.add_argument("--redis-url", default=os.environ.get("REGEN_BENCH_REDIS", DEFAULT_REDIS_URL))
    p.add_argument("--engine-stats", action="store_true",
                   help="vLLM's scheduler stats (running, waiting, preemptions, KV cache, prefix cache) of every "
                        "run, (a) and the workers alike (REGEN_ENGINE_STATS=1, worker/engine/stats.py)")
    p.add_argument("--kv-cache-gib", default=None,
                   help=f"VLLM_CPU_KVCACHE_SPACE of every engine (default {KV_CACHE_GIB}; small: a KV-limited engine)")
    args = p.parse_args(argv)
    if args.engine_stats:
        os.environ["REGEN_ENGINE_STATS"] = "1"  # this process's bare engine and, inherited, every worker
    if args.kv_cache_gib:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    started = time.perf_counter()

    model = args.model or tiny_bench_model()
    rows = throughput_rows(args.prompts, seed=args.seed, mean_tokens=args.mean_tokens, max_tokens=args.max_tokens)
    config = run_config(model, args.max_tokens, ignore_eos=args.ignore_eos)
    budgets = [r["max_tokens"] for r in rows]
    from worker.engine.args import parse_engine_args

    extra = parse_engine_args(args.engine_arg)
    settings = engine_args(extra)
    print(f"workload: {len(rows):,} single-turn prompts; max_tokens per request lognormal, mean "
          f"{statistics.mean(budgets):.0f}, median {statistics.median(budgets):.0f}, max {max(budgets)}; "
          f"ignore_eos {'on' if config.sampling.get('ignore_eos') else 'off (--ignore-eos turns it on)'}")
    print(f"engine (a, b, c): {', '.join(f'{k}={v}' for k, v in settings.items())}; "
          f"VLLM_CPU_KVCACHE_SPACE={os.environ['VLLM_CPU_KVCACHE_SPACE']}")
    from worker.engine.admission import admission_level, batches_to_hold

    held = args.concurrency or batches_to_hold(settings["max_num_seqs"])
    print(f"system (b): batches of {args.batch_size}, K={held} held"
          f"{'' if args.concurrency else ' at the start (the default; grown while the engine starves)'}"
          f", admitted to the engine {admission_level(settings['max_num_seqs'])} conversations at a time "
          f"(max_num_seqs {settings['max_num_seqs']}); baseline (c): "
          f"K=1; order: a, then {args.cycles} x (b, a{'' if args.no_baseline else ', c, a'})", flush=True)

    kinds = [("b", args.concurrency)] + ([] if args.no_baseline else [("c", 1)])
    with scratch_services(admin_dsn=args.admin_dsn, redis_url=args.redis_url) as scratch:
        jsonl = Path(scratch.workdir) / "prompts.jsonl"
        write_jsonl(jsonl, rows)
        # Every engine loads once, all at the same time; none of it is measured.
        systems = {kind: SystemUnderTest(scratch, model=model, jsonl=jsonl, config=config, concurrency=k,
                                         batch_size=args.batch_size, engine_args={**BENCH_ENGINE_ARGS, **extra},
                                         label=f"{kind}-k{k}")
                   for kind, k in kinds}
        try:
            bare = BareEngine(model, settings)
            prompts, params = bare.requests(rows, config.as_record())
            print(kv_capacity_note(bare.llm, params), flush=True)
            bare.run("warm-up", prompts[:16], params[:16])
            for system in systems.values():
                system.wait_ready()
            engines = {"a": _engine_pids() | {os.getpid()},
                       **{kind: system.worker.pids() for kind, system in systems.items()}}
            # moto serves the system runs' S3: neither the bare engine's frontend nor idle.
            engines["a"] -= set().union({scratch.moto.pid}, *(engines[kind] for kind in systems))
            measurements, idle_cpu_s = [], 0.0
            order = ["a"]
            for _ in range(args.cycles):
                for kind, _k in kinds:
                    order += [kind, "a"]
            for label in order:
                idle = set().union(*(pids for kind, pids in engines.items() if kind != label))
                cpu_before = _cpu_s(idle)
                own_before = _split_cpu_s(engines[label])
                n = sum(m.label.startswith(label) for m in measurements) + 1
                if label == "a":
                    measurements.append(bare.run(f"a{n}", prompts, params))
                else:
                    k = dict(kinds)[label]
                    what = (f"system, K={k or 'auto'}" if label == "b" else "one batch at a time, K=1")
                    measurements.append(system_measurement(f"{label}{n}", what, systems[label].run(f"{label}{n}")))
                idle_cpu_s += _cpu_s(idle) - cpu_before
                own_after = _split_cpu_s(engines[label])
                measurements[-1].engine_cpu_s = own_after[0] - own_before[0]
                measurements[-1].frontend_cpu_s = own_after[1] - own_before[1]
                print(f"{measurements[-1].label}: {measurements[-1].tok_s:,.0f} tok/s "
                      f"(load {measurements[-1].load:.1f})", flush=True)
            bare.shutdown()
        finally:
            for system in systems.values():
                system.stop()
    print(report(measurements, idle_cpu_s=idle_cpu_s, requested=budgets))
    print(f"wall time of the whole benchmark: {time.perf_counter() - started:.0f} s")
    return 0


def _engine_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


if __name__ == "__main__":
    sys.exit(main())
