"""Scheduler settings tried on one engine, loaded once: which concurrency a KV-limited engine runs best at.

    . bench/gpu/unpack.sh && python3 -m bench.gpu.sweep --model .gpu-carry/q32b --prompts 384 \\
        --mean-tokens 1500 --max-tokens 8192 --ignore-eos --try default --try fill=1.0 --try fill=0.9

Issue 31 asks regen to choose its engine settings from the workload, and to choose what
measurements show best. A 32B-shaped engine takes 150-280 s to load on an H200 and the
device time of a session is 30-45 minutes, so building one engine per candidate is not
affordable. Here bare ``LLM.generate`` runs the same requests several times on ONE engine,
built in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and between runs the settings
that vLLM's scheduler reads at every step are changed on its live objects:

- ``cap=N``: the scheduler's running cap (``max_num_running_reqs``, what ``max_num_seqs`` sets);
- ``fill=F``: the cap regen's sizing picks (worker/engine/sizing.py) for F of the KV cache,
  from the workload's prompt and budget lengths;
- ``watermark=W``: the share of KV blocks kept free when admitting (``watermark`` engine arg);
- ``default``: vLLM's defaults as built.

``--profile-steps N`` adds a kernel profile of N steps of the first try, ``--profile-at`` seconds in
(bench/gpu/step_profile.py): where a step's time goes once the scheduler's settings are spent.
``--profile-only`` ends the sweep once that profile is taken: the profile costs ~2.5 minutes of a
768-request burst instead of its ~6, where device time is the scarce thing.

The prefix cache is reset between runs (the same prompts would otherwise prefill for free).
Each run prints its rate, its middle-60% rate, its ratio to the first run, vLLM's
preemptions, the mean running count and KV-cache use over its steps, and the roofline bound
at that concurrency (bench/gpu/bound.py). One process, minutes apart: the ratio compares
settings, not machines. What this cannot show is the whole system (the worker's admission);
bench.gpu.throughput does, with the settings chosen here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field


@dataclass
class Trial:
    label: str
    cap: int
    watermark: float
    tokens: int = 0
    seconds: float = 0.0
    steady: float | None = None
    preemptions: int = 0
    #: (value, seconds the step took) of each step.
    running: list[tuple[int, float]] = field(default_factory=list)
    usage: list[tuple[float, float]] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class ProfileTaken(Exception):
    """Raised out of ``LLM.generate`` by ``--profile-only`` once the profile's window has closed."""


def _stop_after(profiler, step):
    def step_then_stop():
        outputs = step()
        if profiler.result is not None:
            raise ProfileTaken
        return outputs

    return step_then_stop


def peak_live_tokens(prompt_lens: list[int], budgets: list[int]) -> tuple[int, int]:
    """(tokens, at) the cache would hold at most if every request started at once and ran to its budget.

    At ``t`` generated tokens, the requests with a budget above ``t`` each hold their prompt plus ``t``.
    Below the cache's size the burst never fills it, and no cap or watermark has anything to act on
    (the mistake of this sweep's first H200 run, docs/results/h200-gpu-sweep-2026-12-02.txt).
    """
    mean_prompt = sum(prompt_lens) / max(1, len(prompt_lens))
    best = (0, 0)
    for t in range(0, max(budgets, default=0) + 1, 25):
        best = max(best, (int(sum(1 for b in budgets if b > t) * (mean_prompt + t)), t))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=384)
    p.add_argument("--mean-tokens", type=float, default=1500.0)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--try", dest="tries", action="append", default=[], help="settings of one run (repeatable)")
    p.add_argument("--engine-arg", action="append", default=[])
    p.add_argument("--cpu", action="store_true", help="a smoke run on vLLM's CPU build (the tiny model)")
    p.add_argument("--profile-steps", type=int, default=0, metavar="N",
                   help="in the first try, a kernel profile of N engine steps, summed by kind (bench/gpu/step_profile.py)")
    p.add_argument("--profile-at", type=float, default=90.0, metavar="S",
                   help="seconds into the first try the profile starts (default 90: the cache full by then)")
    p.add_argument("--profile-only", action="store_true",
                   help="stop once the profile is taken: no rates, no further tries (needs --profile-steps)")
    args = p.parse_args(argv)
    if args.profile_only and not args.profile_steps:
        p.error("--profile-only needs --profile-steps N")
    tries = args.tries or ["default", "fill=1.0", "fill=0.9"]

    from bench.gpu.bound import CPU_NO_BOUND, Shape, bound_line, seed_hours_line, this_card
    from bench.gpu.live import LiveEngine, check_tries, parse_settings, time_mean
    from bench.gpu.smi import GpuSampler
    from bench.prompts import throughput_rows
    from bench.system_run import steady_tok_s

    rows = throughput_rows(args.prompts, seed=0, mean_tokens=args.mean_tokens, max_tokens=args.max_tokens)
    t0 = time.perf_counter()
    live = LiveEngine.load(args.model, rows, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos,
                           engine_arg=args.engine_arg, cpu=args.cpu)
    bare, prompts, params = live.bare, live.prompts, live.params
    bare.run("warm-up", prompts[:32], params[:32])
    engine, scheduler, kv, kv_tokens = live.engine, live.scheduler, live.kv, live.kv_tokens
    moments = live.moments()
    default_cap, default_batched = scheduler.max_num_running_reqs, scheduler.max_num_scheduled_tokens
    shape = Shape.from_config(args.model)
    card = None if args.cpu else this_card()  # the bound and the GPU-hours are this card's
    print(f"loaded in {time.perf_counter() - t0:.0f} s; {live.engine_line()}", flush=True)
    print(f"workload: {len(rows):,} prompts, prompt mean {moments.prompt_mean:.0f}, budgets mean "
          f"{moments.out_mean:.0f} (max {max(sp.max_tokens for sp in params)}), ignore_eos "
          f"{'on' if args.ignore_eos else 'off'}; a request in the engine holds ~{moments.footprint():,.0f} tokens "
          f"of cache (length-biased): the cache holds ~{kv_tokens / moments.footprint():.0f} of them", flush=True)

    peak, at = peak_live_tokens([len(x["prompt_token_ids"]) for x in prompts], [sp.max_tokens for sp in params])
    print(f"started at once, these requests would hold at most {peak:,} tokens (at {at:,} generated): "
          + (f"{peak / kv_tokens:.1f}x the cache: it fills, the KV-limited regime" if peak > kv_tokens else
             "LESS than the cache: it never fills, so no cap or watermark has anything to act on; use more "
             "--prompts or a smaller cache (--engine-arg gpu_memory_utilization=...)"), flush=True)
    trials: list[Trial] = []
    original_preempt = scheduler._preempt_request
    step = engine.step
    every = [parse_settings(spec, kv_tokens=kv_tokens, footprint=moments.footprint(), default_cap=default_cap,
                            default_batched=default_batched) for spec in tries]
    for settings in every:  # refused before the first run, not minutes of device time into the sweep
        if not settings.hold:
            raise SystemExit(f"--try {settings.label!r}: gmu needs held-back blocks: bench.gpu.steady --as-built")
    check_tries(scheduler, every)
    for settings in every:
        label, cap, watermark = settings.label, settings.cap, settings.watermark
        trial = Trial(label, cap, watermark)
        live.apply(settings)
        # The same prompts would prefill for free from the last run's cache, or from its CPU tier.
        bare.llm.reset_prefix_cache(reset_connector=True)

        def counting_preempt(request, timestamp, *args, _t=trial, **kwargs):
            # Passes through what the scheduler gives: 0.32 added drop_stale_output= to 0.26's (request, timestamp).
            _t.preemptions += 1
            return original_preempt(request, timestamp, *args, **kwargs)

        finished: list[tuple[float, int]] = []

        def timed_step(_t=trial, _f=finished):
            before = time.perf_counter()
            running, usage = len(scheduler.running), kv.usage
            outputs = step()
            now = time.time()
            # Weighted by the step's time: the drain has many short steps, and a mean over steps is its.
            _t.running.append((running, time.perf_counter() - before))
            _t.usage.append((usage, time.perf_counter() - before))
            _f.extend((now, len(o.outputs[0].token_ids)) for o in outputs if getattr(o, "finished", False))
            return outputs

        scheduler._preempt_request = counting_preempt
        profiler = None
        if args.profile_steps and not trials:
            from bench.gpu.step_profile import StepProfiler

            profiler = StepProfiler(steps=args.profile_steps, at_s=args.profile_at, on_device=not args.cpu,
                                    running=lambda: len(scheduler.running), live_tokens=lambda: kv.usage * kv_tokens)
            profiler.arm()
        engine.step = profiler.wrap(timed_step) if profiler else timed_step
        if profiler is not None and args.profile_only:
            engine.step = _stop_after(profiler, engine.step)
        print(f"[{label}] cap {cap}, watermark {watermark}: running", flush=True)
        start, wall0 = time.perf_counter(), time.time()
        stopped = False
        try:
            with GpuSampler() as gpu:  # the card's memory peak: how much of regen's headroom the run used
                outputs = bare.llm.generate(prompts, params, use_tqdm=False)
        except ProfileTaken:
            stopped, outputs = True, []
        finally:
            del engine.step
            scheduler._preempt_request = original_preempt
        trial.seconds = time.perf_counter() - start
        if profiler is not None:
            from bench.gpu.bound import step_floor
            from bench.gpu.step_profile import summarize

            profiler.finish()
            result = profiler.result
            floor = (step_floor(shape, result.running_mean, result.live_tokens_mean, card=card)
                     if result is not None and card is not None and card.bandwidth is not None else None)
            print(f"[{label}] " + (summarize(result, floor=floor) if result else
                                   f"step profile: the run ended before {args.profile_at:.0f} s"), flush=True)
        if stopped:
            # The burst's requests are still in the engine: the process ends here rather than drain them. No rate is
            # printed for a run cut short (its tokens so far would be its ramp's, not a figure to compare).
            print(f"[{label}] stopped after the profile, {trial.seconds:.0f} s in ({trial.preemptions:,} preemptions "
                  f"so far); {gpu.summary()}; wall time {time.perf_counter() - t0:.0f} s", flush=True)
            os._exit(0)
        trial.tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        trial.steady = steady_tok_s(finished, wall0, wall0 + trial.seconds)
        trials.append(trial)
        print(f"[{label}] {trial.tokens:,} tokens in {trial.seconds:.1f} s = {trial.tok_s:,.0f} tok/s; "
              f"{trial.preemptions:,} preemptions; {gpu.summary()}", flush=True)

    first = trials[0].tok_s if trials else 0.0
    print("\n| try | cap | watermark | tok/s | / first | steady (20-80%) | preemptions | running (mean) | "
          "KV used (mean) | bound at that concurrency |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for t in trials:
        running, used = time_mean(t.running), time_mean(t.usage)
        steady = f"{t.steady:,.0f}" if t.steady else "-"
        print(f"| {t.label} | {t.cap} | {t.watermark} | {t.tok_s:,.0f} | {t.tok_s / first:.3f} | {steady} | "
              f"{t.preemptions:,} | {running:.0f} | {used:.0%} | "
              f"{CPU_NO_BOUND if args.cpu else bound_line(shape, running, used * kv_tokens, t.steady or t.tok_s, card=card)} |")
    best = max(trials, key=lambda t: t.tok_s) if trials else None
    if best is not None:
        # A GPU's bound and GPU-hours from a CPU run would be figures nobody measured.
        print(f"\nbest: {best.label} ({best.tok_s:,.0f} tok/s)" + (
            f"; {CPU_NO_BOUND}" if args.cpu else f"; {seed_hours_line(best.tok_s, card=card)}; first: {seed_hours_line(first, card=card)}"))
    print(f"wall time {time.perf_counter() - t0:.0f} s", flush=True)
    bare.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
