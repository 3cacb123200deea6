"""The worker's own Python per conversation, with the engine taken out: where a GPU node's CPU goes.

    python -m bench.worker_cpu                       # 1,024 conversations, batches of 64
    python -m bench.worker_cpu --profile 25          # and cProfile's top 25 functions

On a GPU the engine's step is fast and the worker's Python is what can hold it back:
every conversation is rendered, admitted, parsed and turned into an event on the
engine's event loop (the same loop that runs vLLM's output handler), then classified,
encoded and compressed on a Celery thread. This runs exactly that code
(``worker.conversation.generation.generate_batch``, ``batch_task``'s classification and
``encode_shard``) against a stand-in engine that answers at once with a fixed
completion per prompt, so the CPU time it prints is regen's alone, per step and per
conversation, on this machine's cores. Completions are real text of the shape a thinking
model writes (``<think>`` ... ``</think>`` answer), tokenized by the model's tokenizer, with
lengths from the same lognormal as bench/throughput.py; a share of them call a tool.

Compare two versions of the worker by running this on each: the figures are CPU
seconds of one thread, so they are steadier than wall-clock throughput on a shared
machine, but still run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import random
import statistics
import sys
import time

from bench.prompts import lognormal_lengths, sentence_pool, throughput_rows


class InstantEngine:
    """``EngineHost``'s face towards generate_batch, answering each request at once."""

    def __init__(self, tokenizer, completions: list[list[int]], max_num_seqs: int = 256):
        from worker.engine.admission import AdmissionGate, admission_level

        self.tokenizer = tokenizer
        self.engine_version = "instant (bench)"
        self.admission = AdmissionGate(admission_level(max_num_seqs))
        self._completions = completions
        self._n = 0
        self._tickets = iter(range(1 << 62))

    def new_batch_ticket(self) -> int:
        return next(self._tickets)

    async def generate(self, prompt_token_ids: list[int], sampling: dict):
        from worker.conversation.dialogue import Generation

        ids = self._completions[self._n % len(self._completions)]
        self._n += 1
        await asyncio.sleep(0)  # a real request yields to the loop at least once
        return Generation(prompt_token_ids=list(prompt_token_ids), token_ids=list(ids), text="",
                          finish_reason="stop", stop_reason=None)


def completions(tokenizer, n: int, *, mean_tokens: float, cap: int, tool_share: float, seed: int) -> list[list[int]]:
    """``n`` completions a thinking model would write, as ids ending in the end-of-turn token."""
    rng = random.Random(f"completions-{seed}")
    pool = sentence_pool(seed)
    lengths = lognormal_lengths(n, mean=mean_tokens, cap=cap, seed=seed)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for budget in lengths:
        words: list[str] = []
        while len(words) * 1.3 < budget:
            words += rng.choice(pool).split()
        half = max(1, len(words) // 2)
        text = f"<think>\n{' '.join(words[:half])}\n</think>\n\n{' '.join(words[half:])}"
        if rng.random() < tool_share:
            text += ('\n<tool_call>\n{"name": "read_file", "arguments": {"path": "/etc/' +
                     rng.choice(words).strip(".,") + '"}}\n</tool_call>')
        out.append(tokenizer.encode(text, add_special_tokens=False)[: cap - 1] + [end])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.worker_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--mean-tokens", type=float, default=200.0)
    p.add_argument("--max-tokens", type=int, default=1400)
    p.add_argument("--tool-share", type=float, default=0.1, help="share of completions that end in a tool call")
    p.add_argument("--model", default=None, help="model directory (default: the tiny model regen builds)")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N functions")
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    from bench.throughput import run_config, tiny_bench_model
    from ledger.shards import encode_shard
    from worker.batches.delivery import _classify
    from worker.conversation.generation import generate_batch
    from worker.conversation.rendering import Renderer

    model = args.model or tiny_bench_model()
    tokenizer = AutoTokenizer.from_pretrained(model)
    config = run_config(model, args.max_tokens)
    run = {"name": "bench", "model": model, "sampling": config.as_record(), "config_hash": "bench",
           "provenance": {"engine": "instant", "chat_template_sha256": "", "config_hash": "bench"},
           "quality_thresholds": None}
    rows = throughput_rows(args.conversations, mean_tokens=args.mean_tokens, max_tokens=args.max_tokens)
    samples = [{"sample_id": r["id"], "source": "bench", "messages": r["messages"], "tools": None} for r in rows]
    for i, s in enumerate(samples):
        if i % 10 == 0:
            s["tools"] = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                          "required": ["path"]}}}]
    answers = completions(tokenizer, args.conversations, mean_tokens=args.mean_tokens, cap=args.max_tokens,
                          tool_share=args.tool_share, seed=0)
    engine = InstantEngine(tokenizer, answers)
    renderer = Renderer(tokenizer, max_model_len=8192)
    renderer.parser_for(run["sampling"])  # the parsers load once per process, not per batch: not measured

    batches = [samples[i:i + args.batch_size] for i in range(0, len(samples), args.batch_size)]
    profiler = cProfile.Profile() if args.profile else None
    loop_s = encode_s = 0.0
    tokens = sum(len(a) for a in answers)
    shard_bytes = done = 0
    loop = asyncio.new_event_loop()
    if profiler:
        profiler.enable()
    for batch in batches:
        t0 = time.thread_time()
        out = loop.run_until_complete(generate_batch(engine, renderer, batch, run))
        t1 = time.thread_time()
        done += sum(r["status"] == "done" for r in out)
        _classify(out, run, annotate=True)
        shard_bytes += len(encode_shard(out))
        encode_s += time.thread_time() - t1
        loop_s += t1 - t0
    if profiler:
        profiler.disable()
    loop.close()
    n = len(samples)
    if done != n:
        raise SystemExit(f"only {done} of {n} conversations were regenerated: the stand-in engine is wrong")
    print(f"{n:,} conversations in {len(batches)} batches of {args.batch_size}; {tokens:,} completion tokens "
          f"(mean {statistics.mean(len(a) for a in answers):.0f}); parser: {renderer.parser_for(run['sampling']).description}")
    print(f"{'step':<52} {'CPU-s':>7} {'ms / conversation':>18} {'CPU-s / 1K tokens':>18}")
    for what, s in (("engine loop: render, admit, parse, build the events", loop_s),
                    ("Celery thread: classify, JSON-encode, zstd (the shard)", encode_s),
                    ("both", loop_s + encode_s)):
        print(f"{what:<52} {s:>7.2f} {s / n * 1e3:>18.3f} {s / tokens * 1e3:>18.4f}")
    print(f"shard bytes: {shard_bytes:,} ({shard_bytes / n:,.0f} per conversation); {done} rows done")
    if profiler:
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(args.profile)
        print(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
