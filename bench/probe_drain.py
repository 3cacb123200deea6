"""The estimate probe's drain, two ways on one engine: the waiting repeats dropped (regen's) or worked through.

    python -m bench.probe_drain                         # the tiny random model, vLLM's CPU build
    python -m bench.probe_drain --model .gpu-carry/q8b --engine-arg load_format=dummy \\
        --samples 128 --mean-tokens 1500 --max-tokens 8192 --ignore-eos      # a GPU

``regen estimate``'s probe (worker/engine/pilot.py) keeps a worker's admission level of
conversations in its engine, topped up with repeats, and ends with a drain whose loss against the
full engine it adds to each engine's hours. Where the engine runs fewer than it holds (the KV cache
or max_num_seqs), the rest wait in vLLM's queue; since 2026-12-06 the drain aborts those never
started, because a run works through them at the full rate, which loses nothing, and what follows,
the tail, starts from the same full engine's mix either way. This checks that claim: the probe
runs in turn with the drain as regen has it (``drop``) and with the waiting repeats kept
(``keep``: the probe before the change), over the same samples, ABBA, and prints each drain's
length and loss side by side. The claim holds if the losses agree within the arms' own spread
while ``drop``'s drains are shorter.

One engine serves every arm (prefix caching keeps the prompts of the first arm's repeats for the
rest: the first arm runs cold, which is why the order is ABBA and a warm-up arm runs first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ARMS = ("keep", "drop", "drop", "keep")


def _samples(n: int, mean_tokens: float, max_tokens: int) -> list[dict]:
    from bench.prompts import throughput_rows
    from producer.dataset.normalize import normalize_row

    # Each row's own budget rides on the sample, as regen submit keeps it (worker/conversation/generation.py).
    return [{**normalize_row(row), "max_tokens": row["max_tokens"]}
            for row in throughput_rows(n, seed=1, mean_tokens=mean_tokens, max_tokens=max_tokens)]


async def _keep_waiting() -> int:
    """The probe's drain before 2026-12-06: nothing aborted, the waiting repeats worked through."""
    return 0


def run(args) -> list[dict]:
    from bench.throughput import run_config, tiny_bench_model
    from producer.estimate.estimator import run_document
    from worker.conversation.rendering import Renderer
    from worker.engine.args import parse_engine_args
    from worker.engine.host import EngineHost
    from worker.engine.pilot import probe_samples

    model = args.model or tiny_bench_model()
    config = run_config(model, args.max_tokens, ignore_eos=args.ignore_eos)
    run_record = run_document(config)
    samples = _samples(args.samples, args.mean_tokens, args.max_tokens)
    engine = EngineHost(model=model, engine_args={**parse_engine_args(args.engine_arg), "disable_log_stats": False})
    engine.start()
    results = []
    try:
        renderer = Renderer(engine.tokenizer, engine.max_model_len)
        in_flight = args.in_flight or engine.admission.level
        print(f"engine: max_num_seqs {engine.max_num_seqs}, KV cache {engine.kv_cache_tokens:,} tokens; "
              f"{len(samples)} samples, {in_flight} conversations kept in it", flush=True)
        for index, arm in enumerate(("warm-up (drop)", *ARMS) if args.warm_up else ARMS):
            if arm == "keep":
                engine.abort_unstarted = _keep_waiting  # shadows the method on this instance only
            else:
                vars(engine).pop("abort_unstarted", None)  # the method itself again
            started = time.monotonic()
            result = engine.submit(probe_samples(engine, renderer, samples, run_record, in_flight=in_flight)).result()
            result = {k: v for k, v in result.items() if k != "samples"}
            result.update(arm=arm, probe_s=round(time.monotonic() - started, 2), index=index)
            results.append(result)
            print(f"  {arm:15} probe {result['probe_s']:6.1f} s: samples phase {result['start_s'] or 0:6.1f} s, "
                  f"settled {result['throughput_window_s'] or 0:6.1f} s at {result['tokens_per_s'] or 0:,.0f} tok/s, "
                  f"drain {result['drain_s'] or 0:6.1f} s ({result['drain_tokens'] or 0:,} tokens, "
                  f"{result['drain_unstarted_aborted'] or 0:,} waiting dropped) -> loss {result['drain_loss_s'] or 0:5.2f} s",
                  flush=True)
    finally:
        engine.shutdown()
    return results


def summary(results: list[dict]) -> list[str]:
    """Each arm's drains and losses side by side, and their ratio (the warm-up left out)."""
    arms = {}
    for arm in ("keep", "drop"):
        rows = [r for r in results if r["arm"] == arm]
        losses = [r["drain_loss_s"] for r in rows]
        arms[arm] = {"rows": rows, "drain": statistics.mean(r["drain_s"] for r in rows), "loss": statistics.mean(losses),
                     "spread": max(losses) - min(losses), "probe": statistics.mean(r["probe_s"] for r in rows)}
    lines = ["", "| drain | runs | drain s (each) | loss s (each) | mean loss s | probe s (mean) |",
             "|---|---:|---|---|---:|---:|"]
    for arm, a in arms.items():
        drains = ", ".join(f"{r['drain_s']:.1f}" for r in a["rows"])
        losses = ", ".join(f"{r['drain_loss_s']:.2f}" for r in a["rows"])
        lines.append(f"| {arm} | {len(a['rows'])} | {drains} | {losses} | {a['loss']:.2f} | {a['probe']:.1f} |")
    keep, drop = arms["keep"], arms["drop"]
    lines.append("")
    lines.append(f"drop / keep: drain {drop['drain'] / keep['drain']:.3f}x, probe {drop['probe'] / keep['probe']:.3f}x; "
                 f"loss {drop['loss']:.2f} s against {keep['loss']:.2f} s "
                 f"(each arm's spread: keep {keep['spread']:.2f} s, drop {drop['spread']:.2f} s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probe_drain", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="the model (default: the tiny random one, built offline)")
    p.add_argument("--samples", type=int, default=48, help="sampled conversations the probe generates")
    p.add_argument("--mean-tokens", type=float, default=120.0, help="mean of the lognormal output budget")
    p.add_argument("--max-tokens", type=int, default=480, help="cap of the output budget (the run's max_tokens)")
    p.add_argument("--ignore-eos", action="store_true", help="every answer to its budget (random weights stop early)")
    p.add_argument("--in-flight", type=int, default=None,
                   help="conversations kept in the engine (default: a worker's admission level)")
    p.add_argument("--engine-arg", action="append", default=[], help="vLLM engine argument key=value")
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="no cold arm before the four")
    p.add_argument("--json", default=None, help="also write every arm's results here")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    results = run(args)
    print("\n".join(summary(results)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
