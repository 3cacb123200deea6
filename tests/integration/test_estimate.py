"""``regen estimate`` end to end: a real sample draw, a real probe subprocess on vLLM, S3 for the saved estimate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ledger.objects import ObjectStore
from tests.support.helpers import ROOT

pytestmark = [pytest.mark.engine]

SAMPLE = ROOT / "data" / "sample"


def estimate_argv(args: list[str]) -> list[str]:
    """``regen estimate ARGS``."""
    return [sys.executable, "-m", "producer.cli", "estimate", *args]


def run_estimate(args: list[str], env: dict[str, str], *, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(estimate_argv(args), env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"regen estimate exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def estimate_env(s3_env):
    return {**os.environ, **s3_env, "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_estimate_generates_a_stratified_sample_and_extrapolates_with_intervals(estimate_env, s3_bucket,
                                                                                tiny_model, tmp_path):
    probe_file = tmp_path / "probe.json"
    output = f"{s3_bucket}/regen/planned"
    common = [str(SAMPLE), "--model", str(tiny_model), "--sample", "24", "--max-tokens", "48", "--seed", "7",
              "--engine-arg", "max_model_len=4096", "--probe-in-flight", "32", "--probe-results", str(probe_file)]
    proc = run_estimate([*common, "--json", "--output", output], estimate_env)
    doc = json.loads(proc.stdout)
    # Said as it went, on stderr (stdout is the JSON): the draw, the engine's start, each phase of the probe.
    said = [line for line in proc.stderr.splitlines() if line.startswith("estimate: ")]
    for start in ("estimate: drew ", "estimate: probe: ", "estimate: engine ready in ", "estimate: samples: ",
                  "estimate: settled: "):
        assert any(line.startswith(start) for line in said), (start, said)

    # Counted like submit: 291 good rows, one repeats an id; 8 malformed rows.
    assert doc["rows"] == 290 and doc["rejected"] == 8 and doc["duplicates"] == 1
    assert doc["sample_size"] >= 24
    assert sum(s["sample_size"] for s in doc["strata"]) == doc["sample_size"]
    assert sum(s["population"] for s in doc["strata"]) == doc["rows"]

    probe = json.loads(probe_file.read_text())
    assert len(probe["samples"]) == doc["sample_size"]
    # The engine was kept full (32 conversations) with repeats until the last sample ended.
    assert probe["in_flight"] == 32 and probe["repeats"] > 0
    assert probe["tokens_per_s"] > 0 and probe["first_to_last_tokens_per_s"] > 0
    assert probe["output_tokens"] == sum(s["completion_tokens"] for s in probe["samples"]) > 0
    # Then it kept the engine full as long again and measured that settled phase only...
    assert probe["throughput_window_s"] >= 0.5 * probe["wall_s"]
    assert probe["settled_share"] == 1.0 and probe["settled_phase_s"] >= probe["samples_phase_s"]
    # ...and the rate over that phase's first half, what --probe-settled 0.5 would have measured, beside it.
    assert probe["settled_first_half_tokens_per_s"] > 0
    # ...then let it drain as a run's end does, and measured what that cost. Random weights run
    # every request to exactly max_tokens, so the last ones can end together and the drain read
    # 0.0 s and 0 tokens (seen once in three full runs): measured, possibly nothing.
    assert probe["drain_s"] is not None and probe["drain_s"] >= 0 and probe["drain_tokens"] >= 0
    assert 0 <= probe["drain_loss_s"] <= probe["drain_s"]
    assert doc["drain_hours"] == pytest.approx(probe["drain_loss_s"] / 3600, rel=1e-3, abs=1e-6)
    # ...and its first phase (every sample at once, as a run's start) against the settled rate.
    assert probe["start_s"] is not None and probe["start_tokens"] > 0
    assert 0 <= probe["start_loss_s"] <= probe["start_s"]
    assert doc["start_hours"] == pytest.approx(probe["start_loss_s"] / 3600, rel=1e-3, abs=1e-6)
    for s in probe["samples"]:
        assert s["reasoning_tokens"] + s["answer_tokens"] <= s["completion_tokens"]
        # max_tokens 48 per generation: a truncated one hit it exactly.
        assert s["truncated"] == ("length" in s["finish_reasons"])
    # The arithmetic: Σ over strata of population × the stratum's mean.
    assert doc["total_output_tokens"]["value"] == pytest.approx(
        sum(s["population"] * s["mean_output_tokens"] for s in doc["strata"]), rel=1e-3)
    for key in ("total_output_tokens", "engine_hours", "wall_hours", "truncated_share"):
        assert doc[key]["ci_low"] <= doc[key]["value"] <= doc[key]["ci_high"], key
    assert doc["throughput"]["source"] == "measured by the probe"
    assert doc["tokens_per_s"] == pytest.approx(probe["tokens_per_s"], rel=1e-3)
    assert doc["work_hours"]["value"] == pytest.approx(
        doc["total_output_tokens"]["value"] / doc["tokens_per_s"] / 3600, rel=1e-6)
    assert doc["engine_hours"]["value"] == pytest.approx(
        doc["work_hours"]["value"] + doc["start_hours"] + doc["drain_hours"])
    assert doc["config"]["max_tokens"] == 48 and doc["config"]["seed"] == 7
    assert doc["assumptions"] and doc["saved_to"] == f"{output}/estimate.json"
    saved = json.loads(ObjectStore().get(f"{output}/estimate.json"))
    assert saved["total_output_tokens"] == doc["total_output_tokens"]

    # What-if on the same probe results: no engine run, the hours follow the given throughput.
    what_if = json.loads(run_estimate([*common, "--json", "--tokens-per-s", "1000", "--gpus", "4"],
                                      estimate_env).stdout)
    assert what_if["total_output_tokens"] == doc["total_output_tokens"]
    assert what_if["throughput"]["source"].startswith("given")
    work_h = what_if["total_output_tokens"]["value"] / 1000 / 3600
    assert what_if["work_hours"]["value"] == pytest.approx(work_h)
    assert what_if["engine_hours"]["value"] == pytest.approx(
        work_h + 4 * (what_if["start_hours"] + what_if["drain_hours"]))
    assert what_if["wall_hours"]["value"] == pytest.approx(
        work_h / 4 + what_if["start_hours"] + what_if["drain_hours"] + what_if["spread_hours"])
    scaled = json.loads(run_estimate([*common, "--json", "--gpu-type", "H200", "--reference-tokens-per-s", "1000",
                                      "--reference-gpu", "H100"], estimate_env).stdout)
    assert scaled["tokens_per_s"] == pytest.approx(1000 * 4.8 / 3.35, rel=1e-3)
    assert scaled["throughput"]["source"].startswith("EXTRAPOLATED")

    text = run_estimate([*common, "--lengths-only"], estimate_env).stdout
    assert "290 rows ×" in text and "engine-hours" not in text

    # A results file of another draw is refused rather than silently mixed in.
    refused = run_estimate([*common, "--draw-seed", "5"], estimate_env, check=False)
    assert refused.returncode != 0 and "another sample" in (refused.stderr + refused.stdout)


def test_a_gpt_oss_estimate_counts_the_prompts_the_workers_render_with_harmony(estimate_env, tmp_path,
                                                                             tiny_family_model):
    """gpt-oss's prompts are Harmony's (targets/harmony.py), dated as its run is: the probe renders each one as
    a worker does, so every sample is generated and its prompt tokens are the worker's own count."""
    from transformers import AutoTokenizer

    from producer.dataset.normalize import normalize_row
    from tests.support.harmony import DATE
    from worker.conversation.rendering import Renderer

    model = tiny_family_model("gpt_oss")
    lines = [line for name in ("openai_chat.jsonl", "tools.jsonl")
             for line in (SAMPLE / name).read_text().splitlines()[:6]]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    probe_file = tmp_path / "probe.json"
    env = {**estimate_env, "VLLM_SYSTEM_START_DATE": DATE}
    common = [str(data), "--model", str(model), "--sample", "100", "--max-tokens", "64", "--seed", "5",
              "--reasoning-effort", "low", "--engine-arg", "max_model_len=4096", "--probe-results", str(probe_file)]
    # Eager: the test counts prompt tokens, which torch.compile does not change (115 s -> 84 s alone here).
    doc = json.loads(run_estimate([*common, "--engine-arg", "enforce_eager=true", "--probe-in-flight", "8",
                                   "--lengths-only", "--json"], env).stdout)
    assert doc["config"]["chat_format"] == "harmony" and doc["config"]["reasoning_effort"] == "low"
    probe = json.loads(probe_file.read_text())
    # --lengths-only generated the samples and nothing else: no repeats, no settled phase, no rate.
    assert probe["rate_measured"] is False and probe["repeats"] == 0 and probe["tokens_per_s"] is None
    records = {s["sample_id"]: s for s in probe["samples"]}
    # Every sample rendered (a probe without the run's date failed them all as template_error).
    assert doc["rows"] == doc["sample_size"] == len(records) == len(lines)
    assert doc["failed_share"] == 0.0, [(s["sample_id"], s["error"]) for s in records.values() if s["error"]]
    # A census: the estimate's prompt tokens are the probe's, summed.
    assert doc["total_prompt_tokens"]["value"] == sum(s["prompt_tokens"] for s in records.values()) > 0

    renderer = Renderer(AutoTokenizer.from_pretrained(model), 4096)
    options = {"effort": "low", "date": DATE}
    single = 0
    for line in lines:
        sample = normalize_row(json.loads(line))
        record = records[sample["sample_id"]]
        first = next(i for i, m in enumerate(sample["messages"]) if m["role"] == "assistant")
        prompt = renderer.render(sample["messages"][:first], sample.get("tools"), thinking=True,
                                 harmony_options=options)
        if record["turns"] == 1:
            # One generation: its prompt is exactly the worker's Harmony rendering of the context.
            assert record["prompt_tokens"] == len(prompt), sample["sample_id"]
            single += 1
        else:
            # Each later prompt holds the first one and the model's turns after it.
            assert record["prompt_tokens"] > record["turns"] * len(prompt), sample["sample_id"]
    assert single >= 1

    # Those results cannot price hours: reused without --lengths-only, the estimate refuses and says why.
    refused = run_estimate(common, env, check=False)
    assert refused.returncode != 0 and "measured no throughput" in refused.stderr + refused.stdout
