"""Loops stopped while generated (``--stop-loops``): tokens generated with and without the stop, side by side.

    python -m bench.loop_stop                          # the tiny trained model, vLLM's CPU build
    python -m bench.loop_stop --model /models/Qwen3.6-27B --dataset data/*.jsonl --conversations 512 \\
        --max-tokens 32768                             # a GPU node

Two workloads, each run twice through the worker's own path (worker/conversation/generation.py generate_batch on
an EngineHost, the same per-sample seeds), once with the run's loops stopped (the default) and once without:

(1) looping: greedy (temperature 0, where Qwen's cards warn models loop) with the end of turn ignored
    (``ignore_eos``, as bench.throughput's runs): the engine made to loop, since the tiny trained model answers
    in ~50 tokens and stops; past its answer it repeats itself, as a model caught in a loop does;
(2) default: the model's own sampling (generation_config.json), stops honoured: the project's default, where
    no sample should be stopped.

For each: the completion tokens each arm generated, the samples the stop ended, and the false stops: samples the
stop ended whose generation without it the quality classifier does not call ``repetition_loop`` (the stop applies
the classifier's own criterion to the completion so far, so only a completion that loops for a while and then
moves on can be one). The tokens saved are what loops would have spent past their detection.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

#: The demo's conversations (single- and multi-turn, with tools): what the tiny trained model was trained on.
DEFAULT_DATASET = ("data/sample/openai_chat.jsonl", "data/sample/tools.jsonl")


def samples_from(paths: list[str], limit: int) -> list[dict]:
    """Up to ``limit`` conversations as submit normalises them (a bad row is named and skipped), cycled to it."""
    from producer.dataset.normalize import normalize_row

    rows: list[dict] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(normalize_row(json.loads(line)))
                except Exception as e:  # noqa: BLE001 - a row submit would reject is reported, not fatal
                    print(f"{path}:{number}: skipped: {type(e).__name__}: {e}", file=sys.stderr)
    return [{**rows[i % len(rows)], "sample_id": f"loop-{i}"} for i in range(limit)] if rows else []


def run_arm(engine, renderer, samples: list[dict], record: dict) -> tuple[list[dict], float]:
    from worker.conversation.generation import generate_batch

    run = {"id": 1, "name": "loop-stop", "model": engine.model, "provenance": {}, "sampling": record,
           "quality_thresholds": None}
    start = time.perf_counter()
    rows = engine.submit(generate_batch(engine, renderer, samples, run)).result()
    return rows, time.perf_counter() - start


def compare(with_stop: list[dict], without: list[dict]) -> dict:
    """Tokens, stops and false stops of the two arms (rows in the same order, the same samples)."""
    from ledger.quality import Thresholds, classify_sample

    thresholds = Thresholds()
    stopped = [i for i, row in enumerate(with_stop) if (row.get("stop_reason") or "").startswith("repetition_loop")]
    false = [_false_stop(with_stop[i], without[i]) for i in stopped
             if classify_sample(without[i], thresholds)[0] != "repetition_loop"]
    loops_without = sum(classify_sample(row, thresholds)[0] == "repetition_loop" for row in without)
    return {"tokens_with": sum(r["usage"]["completion_tokens"] for r in with_stop),
            "tokens_without": sum(r["usage"]["completion_tokens"] for r in without),
            "stopped": len(stopped), "false_stops": false, "loops_without": loops_without,
            "samples": len(with_stop)}


def _false_stop(stopped: dict, full: dict) -> str:
    """A stopped sample the classifier does not call a loop without the stop, and whether the two arms generated
    the same ids up to the stop (where not, the engine's numbers parted them, not the watch: on a CPU, batches of
    another shape sum in another order, and greedy decoding follows a near tie either way)."""
    from ledger.quality import Thresholds, repetition_share

    t = Thresholds()
    ids = stopped["events"][-1]["completion_token_ids"]
    turn = len(stopped["events"]) - 1
    other = full["events"][turn]["completion_token_ids"] if len(full["events"]) > turn else []
    same = other[:len(ids)] == ids
    share = repetition_share(other, t.repetition_ngram, t.repetition_min_tokens)
    return (f"{stopped['sample_id']} (stopped at {len(ids)}; without the stop {len(other)} ids, repetition share "
            f"{share:.2f}; {'the same ids up to the stop' if same else 'the arms parted before the stop'})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loop_stop", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model directory (default: the tiny trained model, built once per machine)")
    p.add_argument("--dataset", nargs="+", default=list(DEFAULT_DATASET), help="JSONL conversations")
    p.add_argument("--conversations", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=1024, help="each generation's budget (both workloads)")
    p.add_argument("--workload", choices=["looping", "default", "both"], default="both")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    from producer.run_config import build_run_config
    from worker.conversation.rendering import Renderer
    from worker.engine.host import EngineHost

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM's CPU build only: its cache, GiB
    model = args.model
    if model is None:
        from worker.tiny.model import build_tiny_model

        model = str(build_tiny_model(Path("/tmp/regen-bench-model/tiny-trained"), variant="trained"))
    samples = samples_from(args.dataset, args.conversations)
    if not samples:
        print("no usable rows in " + ", ".join(args.dataset), file=sys.stderr)
        return 2
    engine = EngineHost(model=model)
    engine.start()
    renderer = Renderer(engine.tokenizer, engine.max_model_len)
    #: name -> (build_run_config's options, keys set in the record after: ignore_eos is a benchmark's only).
    workloads = {"looping": ({"temperature": 0.0}, {"ignore_eos": True}), "default": ({}, {})}
    chosen = list(workloads) if args.workload == "both" else [args.workload]
    figures = {}
    try:
        # Warm-up, not measured: the engine's first batches of each shape compile or allocate (CPU: seconds).
        warm = build_run_config(model, max_tokens=64, seed=1, thinking="on", stop_loops="on").as_record()
        run_arm(engine, renderer, samples, warm)
        for name in chosen:
            arms = {}
            for stop in ("on", "off"):
                options, extra = workloads[name]
                record = {**build_run_config(model, max_tokens=args.max_tokens, seed=0, thinking="on",
                                             stop_loops=stop, **options).as_record(), **extra}
                arms[stop] = run_arm(engine, renderer, samples, record)
            figures[name] = {**compare(arms["on"][0], arms["off"][0]),
                             "seconds_with": round(arms["on"][1], 1), "seconds_without": round(arms["off"][1], 1)}
    finally:
        engine.shutdown()

    print(f"\n{len(samples)} conversations from {', '.join(args.dataset)}; max_tokens {args.max_tokens}; {model}")
    print("\n| workload | tokens without the stop | tokens with it | saved | samples stopped | loops found "
          "without it (classifier) | false stops | seconds without / with |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, f in figures.items():
        saved = 1 - f["tokens_with"] / f["tokens_without"] if f["tokens_without"] else 0.0
        print(f"| {name} | {f['tokens_without']:,} | {f['tokens_with']:,} | {saved:.1%} | {f['stopped']} of "
              f"{f['samples']} | {f['loops_without']} | {len(f['false_stops'])} | {f['seconds_without']} / "
              f"{f['seconds_with']} |")
    for name, f in figures.items():
        if f["false_stops"]:
            print(f"{name}: false stops: {', '.join(f['false_stops'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
