"""The tiny model in vLLM's CPU build: it loads, generates from token ids and stops.

vLLM starts an engine process and a worker process, so the engine runs in a
child Python that executes this file as a script (``python this_file``, the
``__main__`` block below): pytest's own process never imports vllm, and the
child exits cleanly whatever the engine leaves behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: Loading takes ~30 s on 2 cores (two process spawns, each importing torch and vllm).
ENGINE_TIMEOUT_S = 600
#: 1 GiB of KV cache holds two million tokens of the tiny model: plenty.
KV_CACHE_GIB = "1"
MAX_MODEL_LEN = 8192


def run_engine(model_dir: Path, prompts: list[list[int]], sampling: dict) -> dict:
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
    # the fastest on CPUs with AVX512-BF16/AMX.
    llm = LLM(model=request["model"], max_model_len=MAX_MODEL_LEN, dtype="bfloat16", enforce_eager=True,
              seed=0)
    load_s = time.monotonic() - start
    start = time.monotonic()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in request["prompts"]],
                           SamplingParams(**request["sampling"]), use_tqdm=False)
    generate_s = time.monotonic() - start
    results = [{"token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text,
                "finish_reason": o.outputs[0].finish_reason} for o in outputs]
    print(json.dumps({"load_s": load_s, "generate_s": generate_s, "outputs": results}), flush=True)


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    from worker.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "random", variant="random")


def chat_ids(model_dir: Path, messages: list[dict], **kwargs) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True, **kwargs)["input_ids"])


@pytest.mark.engine
def test_the_random_model_loads_in_vllm_cpu_and_generates_from_token_ids(random_model):
    prompt = chat_ids(random_model, [{"role": "user", "content": "Hello there, how are you?"}])
    report = run_engine(random_model, [prompt] * 16, {"temperature": 0.8, "max_tokens": 128, "seed": 1})
    outputs = report["outputs"]
    assert len(outputs) == 16
    for out in outputs:
        assert out["token_ids"], out
        assert out["finish_reason"] in ("stop", "length")
    tokens = sum(len(o["token_ids"]) for o in outputs)
    print(f"\nvLLM load {report['load_s']:.1f} s, {tokens / report['generate_s']:.0f} tok/s over 16 requests")


@pytest.mark.engine
def test_a_long_generation_fits_the_context(random_model):
    # Outputs of a few thousand tokens must fit: the config allows 8 K positions.
    prompt = chat_ids(random_model, [{"role": "user", "content": "Write a long story."}])
    report = run_engine(random_model, [prompt], {"temperature": 1.0, "max_tokens": 3000, "ignore_eos": True,
                                                 "seed": 2})
    assert len(report["outputs"][0]["token_ids"]) == 3000
    assert report["outputs"][0]["finish_reason"] == "length"


if __name__ == "__main__":
    engine_main()
