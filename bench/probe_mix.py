"""How soon the estimate's probe holds a long run's mix: a renewal simulation, no engine.

    python -m bench.probe_mix                                   # the 32B long workload (mean 1,500, cap 8,192)
    python -m bench.probe_mix --mean-tokens 1500 --max-tokens 32768 --slots 150

The probe (worker/engine/pilot.py) starts its samples at once, tops the engine up with repeats
until the last sample ends (T1, about the longest budget's steps), keeps it full for as long
again and measures its rate over that second phase. Why as long again and not less: a decode
step's cost grows with the KV it reads, the live context of every running sequence, and a
burst that started at once holds young, short contexts until its slots have turned over
several times. A run of days holds the length-biased mix, whose mean live context is
``prompt + E[l^2] / (2 E[l])``. A window that starts before that is reached prices a faster
engine than the run will have.

This simulates just that: ``--slots`` sequences (what the KV cache runs), all starting at step
0, each replaced by a fresh draw of the workload's budgets when it ends (every answer runs to its
budget, as with ``--ignore-eos``), one token a step. It prints the mean live context over
windows of the probe's timeline, as a share of the long run's, averaged over ``--seeds``
independent runs. Time is in steps, which is what the probe's phases are measured in: the
step's duration does not change the mix. What it leaves out: vLLM admits by free blocks, not
a fixed slot count, and preempts the youngest as contexts grow; both keep the running count
near the cache's capacity, which the fixed count stands for.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from bench.prompts import lognormal_lengths

#: Windows of the probe's timeline, in units of T1 (the longest sample's steps).
WINDOWS = ((0.0, 1.0), (0.5, 1.0), (1.0, 1.25), (1.0, 1.5), (1.0, 2.0), (2.0, 3.0))


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    share_of_long_run: float  # the mean over seeds
    spread: float  # the standard deviation over seeds: what one probe's window may be off by


def stationary_context(lengths: list[int], prompt_tokens: int) -> float:
    """A long run's mean live context: a random step lands in a sequence with probability
    proportional to its length (length bias), at a uniform point of it."""
    mean = sum(lengths) / len(lengths)
    return prompt_tokens + sum(x * x for x in lengths) / len(lengths) / (2 * mean)


def simulate(lengths: list[int], *, slots: int, steps: int, prompt_tokens: int, seed: int) -> list[float]:
    """The mean live context of ``slots`` sequences at each step, all starting at step 0."""
    rng = random.Random(f"probe-mix-{seed}")
    ages = [0] * slots
    budgets = [rng.choice(lengths) for _ in range(slots)]
    total_age = 0
    out = []
    for _ in range(steps):
        out.append(prompt_tokens + total_age / slots)
        for i in range(slots):
            ages[i] += 1
            if ages[i] >= budgets[i]:
                total_age -= ages[i] - 1
                ages[i] = 0
                budgets[i] = rng.choice(lengths)
            else:
                total_age += 1
    return out


def windows(lengths: list[int], *, slots: int, prompt_tokens: int, seeds: int, t1: int | None = None,
            spans=WINDOWS) -> list[Window]:
    """Each window's mean live context over a long run's, averaged over ``seeds`` runs."""
    t1 = t1 or max(lengths)
    steps = int(max(end for _, end in spans) * t1)
    stat = stationary_context(lengths, prompt_tokens)
    shares: list[list[float]] = [[] for _ in spans]
    for seed in range(seeds):
        ctx = simulate(lengths, slots=slots, steps=steps, prompt_tokens=prompt_tokens, seed=seed)
        for k, (a, b) in enumerate(spans):
            part = ctx[int(a * t1):int(b * t1)]
            shares[k].append(sum(part) / len(part) / stat)
    return [Window(a, b, statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0)
            for (a, b), v in zip(spans, shares, strict=True)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mean-tokens", type=float, default=1500.0)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--slots", type=int, default=290, help="sequences the KV cache runs (289 on an H200, 32B shape)")
    p.add_argument("--prompt-tokens", type=int, default=90, help="mean prompt length (the benchmark's ~87)")
    p.add_argument("--seeds", type=int, default=4)
    args = p.parse_args(argv)
    lengths = lognormal_lengths(100_000, mean=args.mean_tokens, cap=args.max_tokens, seed=1)
    t1 = max(lengths)
    print(f"budgets lognormal mean {args.mean_tokens:g}, cap {args.max_tokens}; {args.slots} slots; "
          f"T1 = {t1} steps; a long run's mean live context "
          f"{stationary_context(lengths, args.prompt_tokens):,.0f} tokens; {args.seeds} seeds")
    for w in windows(lengths, slots=args.slots, prompt_tokens=args.prompt_tokens, seeds=args.seeds, t1=t1):
        print(f"  window {w.start:.2f}-{w.end:.2f} x T1: mean live context {w.share_of_long_run:.3f} of a long run's"
              f" (one probe's: ±{w.spread:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
