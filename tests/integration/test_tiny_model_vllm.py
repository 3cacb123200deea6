"""The tiny models in vLLM's CPU build: they load, generate from token ids and follow the format.

vLLM starts an engine process and a worker process, so the engine runs in a
child Python that executes this file as a script (the ``__main__`` block
below): pytest's own process never imports vllm, and the child exits cleanly
whatever the engine leaves behind. Each test starts one engine (~30 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

#: Building the trained model (once per machine, then cached) and a vLLM load
#: together exceed the project's 600 s default on a busy 2-core machine.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

#: Loading takes ~30 s on 2 idle cores (two process spawns, each importing torch and vllm).
ENGINE_TIMEOUT_S = 900
#: 1 GiB of KV cache holds two million tokens of the tiny model: plenty.
KV_CACHE_GIB = "1"
MAX_MODEL_LEN = 8192
#: Held-out conversations: the training data uses the build seed (0), these another.
EVAL_SEED = 1234
EVAL_SAMPLES = 100
#: The brief's bar for the trained model; it measures ~0.9 and more.
MIN_PARSE_RATE = 0.8


def run_engine(model_dir: Path, prompts: list[list[int]], sampling: list[dict]) -> dict:
    """Generate with vLLM in a child process; return its JSON report."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=KV_CACHE_GIB, HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    request = json.dumps({"model": str(model_dir), "prompts": prompts, "sampling": sampling})
    proc = subprocess.run([sys.executable, __file__], input=request, capture_output=True, text=True,
                          env=env, timeout=ENGINE_TIMEOUT_S)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"engine child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1])


def engine_main() -> None:
    """The child: read a request on stdin, print one JSON line with outputs and timings."""
    request = json.loads(sys.stdin.read())
    from vllm import LLM, SamplingParams

    start = time.monotonic()
    # enforce_eager: torch.compile on CPU costs ~60 s on first load for ~25 % more
    # speed; the tests want a fast load. bfloat16 is the checkpoint's dtype and
    # the fastest on CPUs with AVX512-BF16/AMX. No chunked prefill: vLLM 0.32's CPU
    # build kills the engine ("CPU Generator does not use offset") when a seeded
    # request's prompt is prefilled in chunks (as worker/engine/host.py notes).
    llm = LLM(model=request["model"], max_model_len=MAX_MODEL_LEN, dtype="bfloat16", enforce_eager=True,
              enable_chunked_prefill=False, seed=0)
    load_s = time.monotonic() - start
    start = time.monotonic()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in request["prompts"]],
                           [SamplingParams(**s) for s in request["sampling"]], use_tqdm=False)
    generate_s = time.monotonic() - start
    results = [{"token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text,
                "finish_reason": o.outputs[0].finish_reason} for o in outputs]
    print(json.dumps({"load_s": load_s, "generate_s": generate_s, "outputs": results}), flush=True)


def build(tmp_path_factory, variant: str) -> Path:
    from worker.tiny.model import build_tiny_model

    # The default cache: the trained variants take their training time once per machine.
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / variant, variant=variant)


@pytest.fixture(scope="module")
def tokenizer_of():
    from transformers import AutoTokenizer

    return lambda model_dir: AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def prompt_ids(tokenizer, messages: list[dict], tools=None, thinking: bool = True) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                              return_dict=True, enable_thinking=thinking)["input_ids"])


def report_speed(name: str, report: dict) -> None:
    tokens = sum(len(o["token_ids"]) for o in report["outputs"])
    print(f"\n{name}: vLLM load {report['load_s']:.1f} s; {tokens} tokens in {report['generate_s']:.1f} s "
          f"= {tokens / report['generate_s']:.0f} tok/s over {len(report['outputs'])} requests")


def format_problems(example, text: str, finish_reason: str) -> list[str]:
    """What is wrong with one generation, as short codes (empty: it parses)."""
    from targets.parsing import parse_tool_calls, split_reasoning

    problems = []
    if finish_reason != "stop":
        problems.append("no_stop")
    split = split_reasoning(text, thinking=example.enable_thinking, finish_reason=finish_reason)
    if not split.think_tags_ok:
        problems.append("think_tags")
    if example.enable_thinking and not text.startswith("<think>"):
        problems.append("no_think")
    calls = parse_tool_calls(split.content)
    if calls.errors or calls.unterminated:
        problems.append("bad_call")
    offered = {tool["function"]["name"] for tool in example.tools or []}
    if any(call["function"]["name"] not in offered for call in calls.tool_calls):
        problems.append("unknown_tool")
    return problems


def test_the_random_model_loads_in_vllm_cpu_and_generates_from_token_ids(tmp_path_factory, tokenizer_of):
    model = build(tmp_path_factory, "random")
    prompt = prompt_ids(tokenizer_of(model), [{"role": "user", "content": "Hello there, how are you?"}])
    sampling = [{"temperature": 0.8, "max_tokens": 128, "seed": i} for i in range(16)]
    # Outputs of a few thousand tokens must fit: the config allows 8 K positions.
    sampling.append({"temperature": 1.0, "max_tokens": 3000, "ignore_eos": True, "seed": 99})
    report = run_engine(model, [prompt] * len(sampling), sampling)
    report_speed("random", report)
    outputs = report["outputs"]
    assert len(outputs) == len(sampling)
    for out in outputs:
        assert out["token_ids"], out
        assert out["finish_reason"] in ("stop", "length")
    assert len(outputs[-1]["token_ids"]) == 3000 and outputs[-1]["finish_reason"] == "length"


def test_the_trained_model_thinks_calls_offered_tools_and_stops(tmp_path_factory, tokenizer_of):
    from worker.tiny import data as tiny_data

    model = build(tmp_path_factory, "trained")
    tok = tokenizer_of(model)
    rng = random.Random(EVAL_SEED)
    examples = [tiny_data.synthetic_example(rng) for _ in range(EVAL_SAMPLES)]
    prompts = [prompt_ids(tok, ex.messages[:-1], ex.tools, ex.enable_thinking) for ex in examples]
    sampling = [{"temperature": 0.8, "top_p": 0.95, "top_k": 20, "max_tokens": 2000, "seed": i}
                for i in range(len(prompts))]
    report = run_engine(model, prompts, sampling)
    report_speed("trained", report)

    problems, calls_when_asked, lengths = Counter(), 0, []
    wants_call = [ex.tools is not None and ex.messages[-2]["role"] == "user" for ex in examples]
    for ex, wants, out in zip(examples, wants_call, report["outputs"], strict=True):
        found = format_problems(ex, out["text"], out["finish_reason"])
        problems.update(found or ["ok"])
        calls_when_asked += wants and "<tool_call>" in out["text"]
        lengths.append(len(out["token_ids"]))
    parse_rate = problems["ok"] / len(examples)
    lengths.sort()
    print(f"parse rate {parse_rate:.2f} {dict(problems)}; calls when tools are asked for "
          f"{calls_when_asked}/{sum(wants_call)}; lengths p10/p50/p90/max "
          f"{lengths[len(lengths) // 10]}/{lengths[len(lengths) // 2]}/{lengths[len(lengths) * 9 // 10]}/{lengths[-1]}")
    assert parse_rate >= MIN_PARSE_RATE, dict(problems)
    assert calls_when_asked >= 0.8 * sum(wants_call)
    # Long-tailed lengths: some answers are many times the median.
    assert lengths[-1] >= 4 * lengths[len(lengths) // 2]


def test_the_stub_model_answers_ok_whatever_the_prompt(tmp_path_factory, tokenizer_of):
    from worker.tiny import data as tiny_data

    model = build(tmp_path_factory, "stub")
    tok = tokenizer_of(model)
    rng = random.Random(EVAL_SEED)
    examples = [tiny_data.synthetic_example(rng) for _ in range(40)]
    prompts = [prompt_ids(tok, ex.messages[:-1], ex.tools, ex.enable_thinking) for ex in examples]
    report = run_engine(model, prompts, [{"temperature": 0.8, "max_tokens": 64, "seed": i}
                                         for i in range(len(prompts))])
    texts = Counter((ex.enable_thinking, out["text"], out["finish_reason"])
                    for ex, out in zip(examples, report["outputs"], strict=True))
    expected = {(True, "<think>\n\n</think>\n\nOK.", "stop"), (False, "OK.", "stop")}
    assert sum(n for key, n in texts.items() if key in expected) >= 0.95 * len(examples), texts


if __name__ == "__main__":
    engine_main()
