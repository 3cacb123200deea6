"""What the worker hands vLLM from a run's record: ignore_eos only where a benchmark's run carries it."""

from __future__ import annotations

from bench.throughput import run_config
from worker.conversation.generation import engine_sampling
from worker.tiny.model import build_tiny_model


def test_ignore_eos_reaches_vllm_only_from_a_benchmark_run(tmp_path):
    model = str(build_tiny_model(tmp_path / "m", variant="random"))
    real = run_config(model, 64).as_record()  # what regen submit's build_run_config makes
    assert "ignore_eos" not in real
    assert "ignore_eos" not in engine_sampling(real, seed=1, max_tokens=8)
    bench = run_config(model, 64, ignore_eos=True)
    params = engine_sampling(bench.as_record(), seed=1, max_tokens=8)
    assert params["ignore_eos"] is True and params["max_tokens"] == 8 and params["detokenize"] is False
    # It is part of the run's record, so such a run hashes differently from a real one.
    assert bench.hash != run_config(model, 64).hash
