"""MTP speculative decoding priced on dummy weights: synthetic acceptance against no speculation, same engine.

    . bench/gpu/unpack.sh                                  # on the GPU machine
    python3 -m bench.gpu.mtp_table --model .gpu-carry/q36  # k = 1 and 2, acceptance 0.6 / 0.75 / 0.9

Dummy weights cannot measure acceptance (the MTP head's drafts are random), so vLLM's synthetic
rejection sampler (``rejection_sample_method: "synthetic"``) accepts each draft token with the
probability given: what MTP costs per step (the draft layer, the wider verify batch, the rejection
sampler) is real, what it gains is the acceptance set. "Acceptance a" here is the per-position
*conditional* rate: a draft token is accepted with probability a given that the ones before it were, so
vLLM's per-position unconditional rates are a, a^2, ... (mean accepted tokens a step: 1 + a + ... + a^k).

One engine per k: its CUDA graphs are captured once for the speculative batch sizes (vLLM captures
``max_cudagraph_capture_size`` / (k + 1) decode batches' worth), and the acceptance is swept inside it by
rewriting the rejection sampler's conditional rates on the worker (``collective_rpc``), so the three rates
cost one load. The baseline is the same engine settings with no speculation.

Each cell runs N requests of the same length at once (``--ignore-eos``, every request to its budget, so
all finish together and concurrency is N for the whole run, or what the cache holds); ``--concurrency``
lists the Ns. Printed: output tokens/s per cell, its ratio to no speculation at the same N, and the
break-even acceptance per N (interpolated between the measured rates).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time


def _set_conditional_rates(worker, rates: list[float]) -> str:
    """On the GPU worker: overwrite the rejection sampler's conditional acceptance rates in place."""
    import torch

    runner = getattr(worker, "model_runner", worker)
    sampler = getattr(runner, "rejection_sampler", None)
    target = getattr(sampler, "synthetic_conditional_rates", None)
    if target is None:
        return "no synthetic rejection sampler on this worker"
    target.copy_(torch.tensor(rates, dtype=target.dtype, device=target.device))
    return "ok"


def engine(model: str, k: int, acceptance: float, *, max_model_len: int, max_seqs: int, extra: dict):
    from vllm import LLM

    # max_num_seqs is the largest concurrency priced, and the CUDA graphs cover every decode batch of it: a
    # speculative step verifies k + 1 tokens a sequence, so its graphs go up to max_seqs * (k + 1) tokens
    # (vLLM's default cap of 512 would leave the k = 2 engine at N = 256 running eagerly).
    settings = {"load_format": "dummy", "max_model_len": max_model_len, "disable_log_stats": True,
                "max_num_seqs": max_seqs,
                "compilation_config": {"max_cudagraph_capture_size": max_seqs * (k + 1)}, **extra}
    if k:
        settings["speculative_config"] = {
            "method": "mtp", "num_speculative_tokens": k, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [acceptance ** (i + 1) for i in range(k)]}
    return LLM(model=model, **settings)


def run_cell(llm, n: int, tokens: int, prompt_len: int, seed: int) -> tuple[int, float]:
    from vllm import SamplingParams

    vocab = llm.llm_engine.model_config.get_vocab_size()
    prompts = [{"prompt_token_ids": [(seed * 7919 + i * 104729 + j * 31) % (vocab - 16) + 8 for j in range(prompt_len)]}
               for i in range(n)]
    params = SamplingParams(temperature=0.7, top_p=0.8, max_tokens=tokens, ignore_eos=True, seed=seed)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs), seconds


def break_even(rates: dict[float, float]) -> str:
    """The acceptance at which a k's speedup crosses 1.0, interpolated; or where it stays."""
    points = sorted(rates.items())
    if points[0][1] >= 1.0:
        return f"pays at every rate tried (>= {points[0][0]})"
    for (a0, r0), (a1, r1) in itertools.pairwise(points):
        if r0 < 1.0 <= r1:
            return f"pays above ~{a0 + (1.0 - r0) * (a1 - a0) / (r1 - r0):.2f}"
    return f"does not pay up to {points[-1][0]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.mtp_table", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--k", default="1,2", help="draft tokens per step to price")
    p.add_argument("--acceptance", default="0.6,0.75,0.9", help="per-position conditional acceptance rates")
    p.add_argument("--concurrency", default="64,256", help="requests in flight per cell")
    p.add_argument("--tokens", type=int, default=1024, help="output tokens per request")
    p.add_argument("--prompt-len", type=int, default=256,
                   help="prompt tokens per request (short: the cells price decoding, and a prefill is in each)")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--engine-arg", default="{}", help="JSON of extra engine args for every engine")
    args = p.parse_args(argv)
    ks = [int(x) for x in args.k.split(",") if x]
    rates = [float(x) for x in args.acceptance.split(",") if x]
    ns = [int(x) for x in args.concurrency.split(",") if x]
    extra = json.loads(args.engine_arg)
    table: dict[tuple[int, float, int], float] = {}
    t_all = time.perf_counter()
    for k in [0, *ks]:
        t0 = time.perf_counter()
        llm = engine(args.model, k, rates[0], max_model_len=args.max_model_len, max_seqs=max(ns), extra=extra)
        print(f"engine k={k}: loaded in {time.perf_counter() - t0:.0f} s", flush=True)
        run_cell(llm, 8, 32, args.prompt_len, seed=1)  # warm-up
        for a in (rates if k else [0.0]):
            if k:
                said = llm.collective_rpc(_set_conditional_rates, args=([a] * k,))
                print(f"  k={k} acceptance {a}: {said}", flush=True)
            for n in ns:
                tokens, seconds = run_cell(llm, n, args.tokens, args.prompt_len, seed=2)
                table[(k, a, n)] = tokens / seconds
                print(f"  k={k} a={a} N={n}: {tokens:,} tokens in {seconds:.1f} s = {tokens / seconds:,.0f} tok/s",
                      flush=True)
        engine_core = getattr(llm.llm_engine, "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        del llm
    print("\n| k | acceptance | mean tokens a step | " + " | ".join(f"N={n} tok/s (x none)" for n in ns) + " |")
    print("|---|---:|---:|" + "---:|" * len(ns))
    print("| none | - | 1.00 | " + " | ".join(f"{table[(0, 0.0, n)]:,.0f} (1.00)" for n in ns) + " |")
    for k in ks:
        for a in rates:
            mean = sum(a ** i for i in range(k + 1))
            cells = [f"{table[(k, a, n)]:,.0f} ({table[(k, a, n)] / table[(0, 0.0, n)]:.2f})" for n in ns]
            print(f"| {k} | {a} | {mean:.2f} | " + " | ".join(cells) + " |")
    for k in ks:
        for n in ns:
            print(f"k={k}, N={n}: {break_even({a: table[(k, a, n)] / table[(0, 0.0, n)] for a in rates})}")
    print(f"\nwall time: {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
