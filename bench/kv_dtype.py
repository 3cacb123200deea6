"""An fp8 KV cache against the model's own dtype: token agreement at temperature 0, and each one's speed.

    python -m bench.kv_dtype                                   # the tiny trained model, vLLM's CPU build
    python -m bench.kv_dtype --model /models/Qwen3-27B --dataset data/*.jsonl --prompts 512   # a GPU node

``--engine-arg kv_cache_dtype=fp8`` halves the KV cache's bytes a token, so a KV-limited engine
(docs/performance.md, "The seed's regime") holds about twice the sequences. It is never regen's
default: it changes the numbers attention reads, so the target's distribution, which is what a
drafter learns, shifts. This prices the shift. Three runs of the same rendered prompts (the
worker's own rendering and per-sample seeds), greedy:

(1) the model's dtype (``kv_cache_dtype=auto``);
(2) the same engine again: the control. On a GPU, batch composition alone changes the floating-point
    sums, so two bf16 runs can part at a near tie; what (3) adds beyond (2) is the fp8 cache's;
(3) a new engine with ``kv_cache_dtype=fp8``.

Each of (2) and (3) against (1): the share of outputs identical token for token, the share of all
of (1)'s tokens generated before the first difference, where the first difference falls, and the
share that stopped for the same reason at the same length. Then each run's output tokens a second.

Agreement means something only for trained weights: with the benchmark's dummy weights every logit
is a near tie, so use those for the speed (``bench.gpu.throughput --candidate kv_cache_dtype=fp8``),
a real checkpoint for the agreement.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: The demo's conversations (single- and multi-turn, with tools): what the tiny trained model was trained on.
DEFAULT_DATASET = ("data/sample/openai_chat.jsonl", "data/sample/tools.jsonl")


@dataclass
class Outputs:
    label: str
    ids: list[list[int]]
    finish: list[str]
    seconds: float

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.ids)


@dataclass
class Agreement:
    """How far ``other`` follows ``reference``, request by request."""

    identical: float
    prefix_share: float
    first_difference: list[int]
    same_stop: float

    @classmethod
    def of(cls, reference: Outputs, other: Outputs) -> Agreement:
        if len(reference.ids) != len(other.ids) or not reference.ids:
            raise ValueError("the two runs must cover the same, non-empty list of requests")
        same, before, firsts, stops = 0, 0, [], 0
        for a, b, fa, fb in zip(reference.ids, other.ids, reference.finish, other.finish, strict=True):
            k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            if a == b:
                same += 1
            elif k < len(a):
                firsts.append(k)
            before += k
            stops += fa == fb and len(a) == len(b)
        n = len(reference.ids)
        return cls(identical=same / n, prefix_share=before / max(1, reference.tokens), first_difference=firsts,
                   same_stop=stops / n)

    def describe(self) -> str:
        where = (f"first difference at token {statistics.median(self.first_difference):.0f} (median), "
                 f"{min(self.first_difference)} at the earliest" if self.first_difference else "no difference")
        return (f"{self.identical:.1%} identical; {self.prefix_share:.1%} of the reference's tokens before the "
                f"first difference; {where}; {self.same_stop:.1%} stopped alike at the same length")


def first_prompt(messages: list[dict]) -> list[dict]:
    """What the first generation of a conversation is asked: the messages before its first assistant turn."""
    cut = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return messages[:cut]


def rows_from(paths: list[str], limit: int) -> list[dict]:
    """Up to ``limit`` rows that submit accepts, each cut to its first prompt (a bad row is named and skipped)."""
    from producer.dataset.normalize import normalize_row

    rows: list[dict] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if len(rows) >= limit:
                    return rows
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    row = {**row, "messages": first_prompt(normalize_row(row)["messages"])}
                except Exception as e:  # noqa: BLE001 - a row submit would reject is reported, not fatal
                    print(f"{path}:{number}: skipped: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                rows.append(row)
    return rows


def generate(label: str, engine, prompts: list[dict], params: list) -> Outputs:
    start = time.perf_counter()
    outs = engine.llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return Outputs(label, [list(o.outputs[0].token_ids) for o in outs],
                   [str(o.outputs[0].finish_reason) for o in outs], seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kv_dtype", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model directory (default: the tiny trained model, built once per machine)")
    p.add_argument("--dataset", nargs="+", default=list(DEFAULT_DATASET), help="JSONL conversations")
    p.add_argument("--prompts", type=int, default=256, help="at most this many conversations (cycled if fewer)")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--fp8", default="fp8", help="the kv_cache_dtype to price (fp8, fp8_e4m3, fp8_e5m2)")
    p.add_argument("--engine-arg", action="append", default=[], help="for every engine")
    args = p.parse_args(argv)
    from bench.throughput import KV_CACHE_GIB, BareEngine, engine_args
    from producer.run_config import build_run_config
    from worker.engine.args import parse_engine_args

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)  # vLLM's CPU build only: its cache, GiB

    model = args.model
    if model is None:
        from worker.tiny.model import build_tiny_model

        model = str(build_tiny_model(Path("/tmp/regen-bench-model/tiny-trained"), variant="trained"))
    rows = rows_from(args.dataset, args.prompts)
    if not rows:
        print("no usable rows in " + ", ".join(args.dataset), file=sys.stderr)
        return 2
    # Cycled to --prompts, each copy its own sample id: another seed, and no prefix cache shared across copies'
    # answers (prompts may share a prefix; that is what a run sees too).
    rows = [{**rows[i % len(rows)], "id": f"kv-{i}"} for i in range(args.prompts)]
    for row in rows:
        row["max_tokens"] = args.max_tokens
    # Greedy: any difference is the numbers', not the dice's. The run's record otherwise as submit makes it.
    sampling = build_run_config(model, max_tokens=args.max_tokens, temperature=0.0, seed=0, thinking="on").as_record()

    from vllm.platforms import current_platform

    base = engine_args(parse_engine_args(args.engine_arg), on_cpu=current_platform.is_cpu())
    runs: list[Outputs] = []
    for dtype in ("auto", args.fp8):
        engine = BareEngine(model, {**base, "kv_cache_dtype": dtype})
        prompts, params = engine.requests(rows, sampling)
        print(f"kv_cache_dtype={dtype}: KV cache {engine.kv_tokens:,} tokens", flush=True)
        runs.append(generate(f"kv_cache_dtype={dtype}", engine, prompts, params))
        if dtype == "auto":
            runs.append(generate("kv_cache_dtype=auto, again (the control)", engine, prompts, params))
        del engine
        gc.collect()

    reference, control, fp8 = runs
    lengths = [len(x) for x in reference.ids]
    print(f"\n{len(rows):,} conversations from {', '.join(args.dataset)}; max_tokens {args.max_tokens}; greedy; "
          f"the reference's answers: mean {statistics.mean(lengths):.0f} tokens, "
          f"{sum(f == 'length' for f in reference.finish) / len(lengths):.1%} cut at max_tokens")
    print("\n| run | output tokens | seconds | tok/s | against (1) |\n|---|---:|---:|---:|---|")
    for i, run in enumerate(runs, 1):
        against = "-" if run is reference else Agreement.of(reference, run).describe()
        print(f"| ({i}) {run.label} | {run.tokens:,} | {run.seconds:.1f} | {run.tokens / run.seconds:,.0f} | "
              f"{against} |")
    extra = Agreement.of(reference, fp8).prefix_share - Agreement.of(reference, control).prefix_share
    print(f"\nwhat the fp8 cache adds to the control's differences: {extra:+.1%} of the reference's tokens "
          "generated before the first difference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
