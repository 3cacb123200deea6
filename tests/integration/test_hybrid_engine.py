"""The users' hybrid target (Qwen3.5/3.6's architecture) on the CPU build: a run with no --engine-arg finishes,
and a worker whose engine can never be built stops in one line, its batch handed back (docs/hybrid.md)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from tests.support.helpers import ROOT, cli_env, run_cli, status_json, wait_for
from worker.engine.build_errors import EXIT_ENGINE_NEVER_BUILDS

pytestmark = [pytest.mark.engine, pytest.mark.slow]

#: A few multi-turn conversations of the sample (a next turn repeats the previous prompt: prefix caching's case).
ROWS = 6


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory):
    from worker.tiny.hybrid import build_tiny_hybrid

    return build_tiny_hybrid(tmp_path_factory.mktemp("models") / "tiny-hybrid")


def _submit(env, tmp_path, model, run: str, output: str) -> dict:
    rows = (ROOT / "data" / "sample" / "openai_chat.jsonl").read_text().splitlines()[:ROWS]
    data = tmp_path / f"{run}.jsonl"
    data.write_text("\n".join(rows) + "\n")
    out = run_cli(["submit", str(data), "--run", run, "--model", str(model), "--output", output,
                   "--batch-size", "3", "--max-tokens", "16", "--seed", "7", "--json",
                   "--quality-thresholds", '{"gate_overridden": true}'], env)  # random weights: all truncated
    return json.loads(out.stdout)


def test_a_tiny_hybrid_run_finishes_on_the_cpu_with_no_engine_arg(settings, s3_env, s3_bucket, sessions,
                                                                  start_worker, tiny_hybrid, tmp_path):
    env = cli_env(settings, s3_env)
    worker = start_worker("hybrid", model=str(tiny_hybrid), engine_args=[])
    worker.wait_ready()
    report = _submit(env, tmp_path, tiny_hybrid, "hybrid", f"{s3_bucket}/regen/hybrid")
    final = wait_for(lambda: (s := status_json(env, "hybrid"))["samples"]["pending"] == 0
                     and s["batches"]["running"] == 0 and s, timeout_s=300, what="the hybrid run done",
                     interval_s=2, on_timeout=lambda: worker.log()[-4000:])
    assert final["samples"]["done"] == report["samples_new"] == ROWS and final["samples"]["failed"] == 0
    with sessions() as s:
        provenance = s.execute(text("SELECT provenance FROM runs WHERE name = 'hybrid'")).scalar()
    args = provenance["engine_settings"]["args"]
    # regen's choice for a hybrid on the CPU build: no prefix caching (it would need chunked prefill).
    assert args["enable_prefix_caching"] is False and args["enable_chunked_prefill"] is False, args
    # Its capacity as recorded is vLLM's (issue 56): the sequences of max_model_len its blocks hold, a sequence's
    # 3 linear-attention states taking a block each beside its KV (worker/engine/cache_plan.py), not
    # blocks x block_size, which counted the states' blocks as tokens.
    engine = provenance["engine_settings"]
    blocks, block, length = engine["kv_cache_blocks"], engine["kv_block_size"], engine["max_model_len"]
    assert engine["state_blocks_per_sequence"] == 3, engine
    assert engine["kv_cache_tokens"] == int(blocks / (-(-length // block) + 3) * length) < blocks * block, engine
    assert worker.stop() == 0, worker.log()[-3000:]


def test_a_worker_whose_engine_can_never_be_built_stops_in_one_line_and_hands_its_batch_back(
        settings, s3_env, s3_bucket, sessions, start_worker, tiny_hybrid, tmp_path):
    env = cli_env(settings, s3_env)
    report = _submit(env, tmp_path, tiny_hybrid, "never", f"{s3_bucket}/regen/never")
    # Prefix caching without chunked prefill: vLLM refuses the hybrid's config ("Chunked prefill is
    # required for mamba cache mode 'align'") however often it is asked. No --model: the first batch builds it.
    worker = start_worker("never", preload=False, engine_args=[
        "--engine-arg", "enable_prefix_caching=true", "--engine-arg", "enforce_eager=true"])
    code = worker.proc.wait(timeout=240)
    log = worker.log()
    assert code != 0, log[-3000:]
    lines = [line for line in log.splitlines() if "stopped for good: its engine can never be built" in line]
    assert len(lines) == 1 and "Chunked prefill is required for mamba cache mode 'align'" in lines[0], log[-3000:]
    assert f"exited with {EXIT_ENGINE_NEVER_BUILDS}" not in log and "restarting in" not in log, log[-3000:]
    assert "can never be built (its last line says why); not restarting it" in log
    status = status_json(env, "never")
    assert status["samples"]["failed"] == 0 and status["batches"]["running"] == 0, status
    assert status["samples"]["pending"] == report["samples_new"], status
    with sessions() as s:
        attempts = s.execute(text("SELECT sum(attempts), sum(failures) FROM batches b JOIN runs r ON r.id = b.run_id "
                                  "WHERE r.name = 'never'")).one()
    assert attempts[0] >= 1 and not attempts[1], attempts  # claimed, handed back, no failure counted
