"""Engine settings compared in the steady state of ONE engine, kept fed the way a farm keeps it fed.

    . bench/gpu/unpack.sh && python3 -m bench.gpu.steady --model .gpu-carry/q32b --ignore-eos \\
        --as-built 0.92 --try default --try watermark=0.01,gmu --try default --try watermark=0.03,gmu

The engine is built with regen's settings (worker/engine/host.py ``engine_defaults``): on an
empty H200 that is gpu_memory_utilization 0.95 (worker/engine/gpu_memory.py), so ``--as-built
0.92`` (vLLM 0.26's default) makes every segment but a ``gmu`` one run with vLLM's cache.

Why not bench.gpu.sweep: a sweep runs a burst of requests to its end, once per setting. A
burst small enough to afford at 32B never fills the cache (the sweep's first H200 run), and
one large enough spends most of its time in its start and drain, where a farm's engine
never is: a worker keeps ~1.5 x max_num_seqs conversations in its engine for hours. Here
the engine is loaded once, in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and kept
at ``--queue`` unfinished requests (new ones added before every step, from ``--rows``
distinct prompts); the settings that vLLM's scheduler reads at every step are changed on
its live objects every ``--segment`` seconds, and each segment is measured after its first
``--settle`` share (the population of the cache adjusting to the new setting):

- ``default``: vLLM's defaults as built (the control: run it between the others, so each
  candidate is compared with the mean of the controls beside it, not with a drifting start);
- ``cap=N`` / ``fill=F``: the scheduler's running cap (what ``max_num_seqs`` sets) at N, or at
  what F of the cache holds (worker/engine/sizing.py) for these prompts and budgets;
- ``watermark=W``: the share of KV blocks kept free when admitting (the ``watermark`` engine arg);
- ``batched=N``: the step's token budget (``max_num_batched_tokens``);
- ``gmu``: the whole cache the engine was built with. With ``--as-built G`` the engine is
  built with a larger ``gpu_memory_utilization`` and every other segment holds back the
  blocks beyond what G would have given (taken from the free pool, so the scheduler cannot
  use them), so one engine compares two memory settings.

The rate is exact, not inferred from what finished: generated tokens are counted at the
window's ends (tokens of requests finished since, plus the output tokens every live
request holds: a preempted request keeps its output and recomputes it as prefill, so
recomputation is not counted as output). Also printed: preemptions, the tokens the
scheduler scheduled per second (output + prefill + recomputed), the time-weighted running
count and live KV tokens, and the roofline bound (bytes and FLOPs) at that concurrency (bench/gpu/bound.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

from bench.gpu.live import Settings


@dataclass
class Segment:
    #: What the live scheduler is set to for this segment (bench/gpu/live.py).
    settings: Settings
    seconds: float = 0.0
    tokens: int = 0
    scheduled: int = 0
    preemptions: int = 0
    finished: int = 0
    #: (requests, tokens) preempted and waiting to be recomputed, at the window's start and end: a
    #: setting that leaves more of them behind than it found borrows its rate from the next one.
    debt: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    #: (value, seconds the step took) of each step in the measured window.
    running: list[tuple[float, float]] = field(default_factory=list)
    live: list[tuple[float, float]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.settings.label

    @property
    def hold(self) -> bool:
        return self.settings.hold

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def neighbour_controls(segments: list[Segment], i: int, control: str = "default") -> list[Segment]:
    """The ``control`` segments (vLLM's defaults unless told) just before and just after segment ``i``."""
    before = next((s for s in reversed(segments[:i]) if s.label == control), None)
    after = next((s for s in segments[i + 1:] if s.label == control), None)
    return [s for s in (before, after) if s is not None]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.steady", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=int, default=8000, help="distinct prompts to draw requests from")
    p.add_argument("--mean-tokens", type=float, default=1500.0)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--queue", type=int, default=2048, help="unfinished requests kept in the engine")
    p.add_argument("--warm", type=float, default=150.0, help="seconds run before the first segment (discarded)")
    p.add_argument("--segment", type=float, default=110.0, help="seconds a setting runs")
    p.add_argument("--settle", type=float, default=0.35, help="share of a segment not measured")
    p.add_argument("--as-built", type=float, default=None,
                   help="gpu_memory_utilization every segment but `gmu` emulates, by holding blocks back")
    p.add_argument("--control", default="default",
                   help="the segments each candidate is compared with (a --try spec, as written): vLLM's defaults "
                        "unless told, e.g. regen's own settings when the candidates are additions to them")
    p.add_argument("--try", dest="tries", action="append", default=[], help="one segment's settings (repeatable)")
    p.add_argument("--engine-arg", action="append", default=[])
    p.add_argument("--cpu", action="store_true", help="a smoke run on vLLM's CPU build (the tiny model)")
    args = p.parse_args(argv)
    tries = args.tries or ["default", "fill=1.0", "default"]

    from bench.gpu.bound import CPU_NO_BOUND, Shape, bound_line, seed_hours_line, this_card
    from bench.gpu.live import LiveEngine, check_tries, parse_settings, time_mean
    from bench.gpu.smi import GpuSampler
    from bench.prompts import throughput_rows

    rows = throughput_rows(args.rows, seed=0, mean_tokens=args.mean_tokens, max_tokens=args.max_tokens)
    t0 = time.perf_counter()
    live = LiveEngine.load(args.model, rows, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos,
                           engine_arg=args.engine_arg, cpu=args.cpu)
    bare, prompts, params = live.bare, live.prompts, live.params
    llm, engine, scheduler, kv, cache = bare.llm, live.engine, live.scheduler, live.kv, live.cache
    pool = kv.block_pool
    block = int(cache.block_size)
    blocks = int(pool.num_gpu_blocks)
    shape = Shape.from_config(args.model)
    card = None if args.cpu else this_card()  # the bound and the GPU-hours are this card's

    # Blocks beyond what --as-built would have given: held by this benchmark in every segment but `gmu`.
    hold_target = 0
    built_gmu = float(cache.gpu_memory_utilization)
    if args.as_built is not None and args.as_built < built_gmu:
        import torch

        total = torch.cuda.mem_get_info()[1]
        hold_target = min(blocks - 1, int((built_gmu - args.as_built) * total / (block * shape.kv_bytes_per_token)))
    held: list = []
    usable = blocks - hold_target

    moments = live.moments()
    default_cap = scheduler.max_num_running_reqs
    default_batched = scheduler.max_num_scheduled_tokens
    print(f"loaded in {time.perf_counter() - t0:.0f} s; {live.engine_line()}"
          + (f"; as built at {args.as_built}: {usable * block:,} tokens ({hold_target:,} blocks held back)"
             if hold_target else ""), flush=True)
    print(f"workload: {len(rows):,} distinct prompts (mean {moments.prompt_mean:.0f} tokens), budgets mean "
          f"{moments.out_mean:.0f} (max {max(sp.max_tokens for sp in params)}), ignore_eos "
          f"{'on' if args.ignore_eos else 'off'}; {args.queue:,} unfinished kept in the engine; a request in it "
          f"holds ~{moments.footprint():,.0f} tokens of cache (length-biased): the usable cache holds "
          f"~{usable * block / moments.footprint():.0f}", flush=True)

    # Preprocess every prompt once (what LLM.generate does per call), then add them as the engine drains.
    engine_inputs = llm._preprocess_cmpl(prompts) if hasattr(llm, "_preprocess_cmpl") else prompts
    next_row = 0
    done_tokens = 0
    done_requests = 0
    preemptions = 0
    scheduled_tokens = 0

    original_preempt = scheduler._preempt_request
    original_schedule = scheduler.schedule

    def counting_preempt(request, timestamp, *args, **kwargs):
        # Passes through what the scheduler gives: 0.32 added drop_stale_output= to 0.26's (request, timestamp).
        nonlocal preemptions
        preemptions += 1
        return original_preempt(request, timestamp, *args, **kwargs)

    def counting_schedule(*a, **kw):
        nonlocal scheduled_tokens
        out = original_schedule(*a, **kw)
        scheduled_tokens += int(out.total_num_scheduled_tokens)
        return out

    scheduler._preempt_request = counting_preempt
    scheduler.schedule = counting_schedule

    def generated() -> int:
        """Output tokens generated so far: finished requests' plus every live request's."""
        return done_tokens + sum(r.num_output_tokens for r in scheduler.requests.values())

    def recompute_debt() -> tuple[int, int]:
        """Requests preempted and not yet recomputed, and the tokens their recomputation will prefill."""
        owed = [r.num_tokens for r in scheduler.requests.values() if r.num_computed_tokens == 0 and r.num_output_tokens]
        return len(owed), sum(owed)

    def apply(seg: Segment) -> None:
        live.apply(seg.settings)
        if not seg.hold and held:
            pool.free_blocks(held)
            held.clear()

    def keep_held(seg: Segment) -> None:
        # Taken back a little at a time as blocks free up (never preempting to get them).
        want = hold_target - len(held) if seg.hold else 0
        if want > 0:
            take = min(want, pool.get_num_free_blocks() - 1)
            if take > 0:
                held.extend(pool.get_new_blocks(take))

    def run_for(seconds: float, seg: Segment, measure_from: float) -> None:
        nonlocal next_row, done_tokens, done_requests
        end = time.perf_counter() + seconds
        start_mark = None
        while time.perf_counter() < end:
            now = time.perf_counter()
            if start_mark is None and now >= measure_from:
                start_mark = (now, generated(), scheduled_tokens, preemptions, done_requests, recompute_debt())
            while engine.get_num_unfinished_requests() < args.queue:
                i = next_row % len(prompts)
                llm._add_request(engine_inputs[i], params[i].clone())
                next_row += 1
            keep_held(seg)
            before = time.perf_counter()
            running = len(scheduler.running)
            live = (blocks - 1 - pool.get_num_free_blocks() - len(held)) * block
            for out in engine.step():
                if getattr(out, "finished", False):
                    done_tokens += len(out.outputs[0].token_ids)
                    done_requests += 1
            if start_mark is not None:
                dt = time.perf_counter() - before
                seg.running.append((running, dt))
                seg.live.append((live, dt))
        if start_mark is not None:
            at, gen, sched, pre, fin, debt = start_mark
            seg.debt = (debt, recompute_debt())
            seg.seconds = time.perf_counter() - at
            seg.tokens = generated() - gen
            seg.scheduled = scheduled_tokens - sched
            seg.preemptions = preemptions - pre
            seg.finished = done_requests - fin

    every = [Segment(parse_settings(spec, kv_tokens=usable * block, footprint=moments.footprint(),
                                    default_cap=default_cap, default_batched=default_batched)) for spec in tries]
    check_tries(scheduler, [s.settings for s in every])
    warm = Segment(Settings("warm-up (default)", default_cap, 0.0, default_batched))
    print(f"[warm-up] {args.warm:.0f} s at vLLM's defaults, not measured", flush=True)
    apply(warm)
    run_for(args.warm, warm, measure_from=float("inf"))
    segments: list[Segment] = []
    try:
        for seg in every:
            apply(seg)
            start = time.perf_counter()
            with GpuSampler() as gpu:  # the card's memory peak: what the engine used beyond its budget, if anything
                run_for(args.segment, seg, measure_from=start + args.settle * args.segment)
            segments.append(seg)
            print(f"[{seg.label}] cap {seg.settings.cap}, watermark {seg.settings.watermark}, "
                  f"batched {seg.settings.batched}, "
                  f"{'held back' if held else 'whole cache'}: {seg.tokens:,} tokens in {seg.seconds:.0f} s = "
                  f"{seg.tok_s:,.0f} tok/s; {seg.preemptions:,} preemptions; running {time_mean(seg.running):.0f}; "
                  f"preempted and waiting: {seg.debt[0][0]} ({seg.debt[0][1]:,} tokens) -> {seg.debt[1][0]} "
                  f"({seg.debt[1][1]:,} tokens); {gpu.summary()}",
                  flush=True)
    finally:
        scheduler._preempt_request = original_preempt
        scheduler.schedule = original_schedule

    kv_bytes = shape.kv_bytes_per_token
    print(f"\nsteady state, {args.segment:.0f} s a setting, measured over its last {1 - args.settle:.0%}; each "
          "compared with the mean of the control segments (`" + args.control + "`) beside it")
    print("| setting | cap | watermark | batched | cache (tokens) | output tok/s | / controls beside | scheduled tok/s "
          "| preemptions /min | ended /min | preempted waiting (start -> end) | running (mean) | live KV tokens (mean) "
          "| bound at that concurrency |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    for i, s in enumerate(segments):
        controls = neighbour_controls(segments, i, args.control)
        base = sum(c.tok_s for c in controls) / len(controls) if controls and s.label != args.control else 0.0
        ratio = f"{s.tok_s / base:.3f}" if base else "-"
        running, live = time_mean(s.running), time_mean(s.live)
        per_min = 60.0 / s.seconds if s.seconds else 0.0
        cache_tokens = (usable if s.hold else blocks) * block
        print(f"| {s.label} | {s.settings.cap} | {s.settings.watermark} | {s.settings.batched} | {cache_tokens:,} | {s.tok_s:,.0f} | {ratio} | "
              f"{s.scheduled / s.seconds if s.seconds else 0:,.0f} | {s.preemptions * per_min:,.0f} | "
              f"{s.finished * per_min:,.0f} | {s.debt[0][0]} ({s.debt[0][1]:,} tok) -> {s.debt[1][0]} "
              f"({s.debt[1][1]:,} tok) | {running:.0f} | {live:,.0f} ({live * kv_bytes / 1e9:.1f} GB) | "
              f"{CPU_NO_BOUND if args.cpu else bound_line(shape, running, live, s.tok_s, card=card)} |")
    defaults = [s.tok_s for s in segments if s.label == args.control]
    if defaults:
        spread = (max(defaults) - min(defaults)) / (sum(defaults) / len(defaults))
        print(f"\nthe control segments (`{args.control}`): {', '.join(f'{x:,.0f}' for x in defaults)} tok/s "
              f"(spread {spread:.1%}: a difference smaller than that is noise)")
        best = max(segments, key=lambda s: s.tok_s)
        print(f"best: {best.label} ({best.tok_s:,.0f} tok/s)" + (
            f"; {CPU_NO_BOUND}" if args.cpu else
            f": {seed_hours_line(best.tok_s, card=card)}; controls' mean: "
            f"{seed_hours_line(sum(defaults) / len(defaults), card=card)}"))
    print(f"wall time {time.perf_counter() - t0:.0f} s", flush=True)
    bare.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
