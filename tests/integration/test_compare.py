"""``regen estimate --compare`` and the token projection of ``regen status``, against a real ledger and S3."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from ledger.objects import ObjectStore
from ledger.states import BatchStatus
from producer.estimate.estimator import save_estimate
from producer.monitoring.status import run_status
from tests.integration.test_estimate import run_estimate
from tests.support.helpers import ROOT, cli_env, run_cli, status_json, wait_for

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def _estimate_doc(**overrides) -> dict:
    doc = {"kind": "regen-estimate", "version": 1, "created_at": "2026-11-29T11:00:00+00:00", "rows": 6,
           "total_output_tokens": {"value": 600.0, "ci_low": 500.0, "ci_high": 700.0},
           "reasoning_tokens": {"value": 300.0, "ci_low": 250.0, "ci_high": 350.0},
           "answer_tokens": {"value": 300.0, "ci_low": 250.0, "ci_high": 350.0},
           "mean_output_tokens": {"value": 100.0, "ci_low": 83.3, "ci_high": 116.7},
           "truncated_share": {"value": 0.2, "ci_low": 0.0, "ci_high": 0.5}, "tokens_per_s": 0.02,
           "work_hours": {"value": 600 / 0.02 / 3600, "ci_low": 500 / 0.02 / 3600, "ci_high": 700 / 0.02 / 3600},
           "engine_hours": {"value": 600 / 0.02 / 3600, "ci_low": 500 / 0.02 / 3600, "ci_high": 700 / 0.02 / 3600},
           "wall_hours": {"value": 600 / 0.02 / 3600, "ci_low": 500 / 0.02 / 3600, "ci_high": 700 / 0.02 / 3600},
           "engines": 1, "longest_conversation_s": 600.0, "config_hash": "c0ffee",
           "throughput": {"source": "measured by the probe"}}
    doc.update(overrides)
    return doc


def _ledger_run(sessions, output: str, *, pending: int = 0) -> None:
    """Run 'r' with 3 done batches on two workers: w1 runs two of them overlapping, w2 one."""
    from sqlalchemy import text

    batches = [  # (seq, worker, start min, end min, samples: (tokens, reasoning, answer, finish))
        (1, "w1", 0, 10, [(100, 50, 50, "stop"), (150, 100, 50, "length")]),
        (2, "w1", 5, 20, [(50, 20, 30, "stop"), (100, 40, 60, "stop")]),
        (3, "w2", 2, 12, [(120, 60, 60, "stop"), (80, 40, 40, "stop")]),
    ]
    with sessions.begin() as s:
        run_id = s.execute(text(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
            "VALUES ('r', 'm', '{}', 'c0ffee', :out, 'regen', 2, 'active') RETURNING id"), {"out": output}).scalar()
        for seq, worker, start, end, samples in batches:
            batch_id = s.execute(text(
                "INSERT INTO batches (run_id, seq, status, attempts, failures, worker, started_at, finished_at, "
                "input_key, n_samples, completion_tokens, prompt_tokens) VALUES (:run, :seq, :st, 1, 0, :w, :s, :f, "
                "'k', :n, :ct, 0) RETURNING id"),
                {"run": run_id, "seq": seq, "st": BatchStatus.DONE.value, "w": worker,
                 "s": T0 + timedelta(minutes=start), "f": T0 + timedelta(minutes=end), "n": len(samples),
                 "ct": sum(x[0] for x in samples)}).scalar()
            for i, (ct, rt, at, finish) in enumerate(samples):
                s.execute(text(
                    "INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status, "
                    "completion_tokens, reasoning_tokens, answer_tokens, finish_reason) VALUES "
                    "(:run, :sid, :b, 'f', :row, 'done', :ct, :rt, :at, :fin)"),
                    {"run": run_id, "sid": f"s{seq}-{i}", "b": batch_id, "row": seq * 10 + i, "ct": ct, "rt": rt,
                     "at": at, "fin": finish})
        if pending:
            batch_id = s.execute(text(
                "INSERT INTO batches (run_id, seq, status, attempts, failures, input_key, n_samples) VALUES "
                "(:run, 4, 'queued', 0, 0, 'k', :n) RETURNING id"), {"run": run_id, "n": pending}).scalar()
            for i in range(pending):
                s.execute(text(
                    "INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status) VALUES "
                    "(:run, :sid, :b, 'f', :row, 'pending')"), {"run": run_id, "sid": f"p{i}", "b": batch_id,
                                                                "row": 100 + i})


def test_compare_counts_each_workers_busy_time_once_and_wall_from_first_start_to_last_finish(
        settings, s3_env, s3_bucket, sessions):
    output = f"{s3_bucket}/regen/r"
    _ledger_run(sessions, output)
    save_estimate(ObjectStore(), output, _estimate_doc())
    env = cli_env(settings, s3_env)
    result = json.loads(run_estimate(["--compare", "r", "--json"], env).stdout)
    actual = result["actual"]
    # w1: [0,10] ∪ [5,20] = 20 min; w2: 10 min. Not 10 + 15 + 10 = 35 min.
    assert actual["engine_hours"] == pytest.approx(30 / 60)
    assert actual["wall_hours"] == pytest.approx(20 / 60)
    assert actual["engines"] == 2 and actual["batches"] == 3
    assert actual["total_output_tokens"] == 600 and actual["reasoning_tokens"] == 310
    assert actual["truncated_share"] == pytest.approx(1 / 6)
    rows = {r["metric"].strip(): r for r in result["rows"]}
    assert rows["output tokens"]["actual_over_estimate"] == pytest.approx(1.0)
    assert rows["output tokens"]["in_ci"] is True
    assert rows["engine-hours"]["actual"] == pytest.approx(0.5)
    # The estimate was for one engine; the run had two, so its hours are recomputed for two:
    # a 300 s drain per engine, and a 300 s spread on the wall-clock.
    work = 600 / 0.02 / 3600
    assert rows["engine-hours"]["estimate"] == pytest.approx(work + 2 * 300 / 3600)
    assert rows["wall hours (2 engines)"]["estimate"] == pytest.approx(work / 2 + 300 / 3600 + 300 / 3600)
    assert result["config_matches"] is True and result["partial"] is False

    text = run_estimate(["--compare", "r"], env).stdout
    for label in ("output tokens", "engine-hours", "wall hours (2 engines)", "actual/est"):
        assert label in text


def test_compare_without_a_saved_estimate_says_how_to_save_one(settings, s3_env, s3_bucket, sessions):
    _ledger_run(sessions, f"{s3_bucket}/regen/r")
    proc = run_estimate(["--compare", "r"], cli_env(settings, s3_env), check=False)
    assert proc.returncode != 0 and "no saved estimate" in proc.stderr + proc.stdout


def test_status_projects_total_tokens_from_the_samples_done_so_far(settings, s3_bucket, sessions):
    _ledger_run(sessions, f"{s3_bucket}/regen/r", pending=4)
    with sessions() as s:
        (run,) = run_status(s, "r")
    projection = run["projection"]
    # 600 tokens over 6 finished samples = 100 per sample; 10 samples in all.
    assert projection["mean_completion_tokens"] == 100.0
    assert projection["completion_tokens_total"] == 1000
    assert projection["completion_tokens_remaining"] == 400


@pytest.mark.engine
@pytest.mark.slow
def test_estimate_of_the_whole_sample_matches_the_farms_actual_tokens(settings, s3_env, s3_bucket, sessions,
                                                                      start_worker, tiny_model):
    """A census estimate (every row drawn) generates what the farm generates: same template, seeds, engine."""
    env = {**cli_env(settings, s3_env), "VLLM_CPU_KVCACHE_SPACE": "1"}
    output = f"{s3_bucket}/regen/census"
    sampling = ["--max-tokens", "32", "--seed", "3"]
    doc = json.loads(run_estimate([str(ROOT / "data" / "sample"), "--model", str(tiny_model), "--sample", "1000",
                                   *sampling, "--engine-arg", "max_model_len=4096", "--output", output, "--json"],
                                  env).stdout)
    assert doc["sample_size"] == doc["rows"] == 290
    # vLLM CPU 0.32 dies on seeded requests prefilled in chunks: whole prompts only (as the probe does).
    worker = start_worker("census", compiled=True, extra=["--engine-arg", "enable_chunked_prefill=false"])
    worker.wait_ready()
    run_cli(["submit", str(ROOT / "data" / "sample"), "--run", "census", "--model", str(tiny_model), "--output",
             output, "--batch-size", "32", *sampling,
             # Random weights: all truncation, which the quality gate would pause; not this test's subject.
             "--quality-thresholds", '{"gate_overridden": true}'], env)
    wait_for(lambda: status_json(env, "census")["samples"]["pending"] == 0, timeout_s=600,
             what="the census run", interval_s=2, on_timeout=lambda: worker.log()[-3000:])
    result = json.loads(run_estimate(["--compare", "census", "--json"], env).stdout)
    rows = {r["metric"].strip(): r for r in result["rows"]}
    assert rows["rows"]["actual"] == 290
    # Same seeds per sample and turn: equal up to the engine's batch-dependent numerics.
    assert rows["output tokens"]["actual_over_estimate"] == pytest.approx(1.0, abs=0.15)
    # The prompts the probe rendered are the workers' (each turn's holds the turns generated before it).
    assert rows["prompt tokens"]["actual_over_estimate"] == pytest.approx(1.0, abs=0.15)
    assert rows["engine-hours"]["actual"] > 0
    assert status_json(env, "census")["projection"]["completion_tokens_total"] == rows["output tokens"]["actual"]


def test_save_as_stores_the_estimate_in_a_submitted_runs_prefix_for_compare(settings, s3_env, s3_bucket, sessions):
    output = f"{s3_bucket}/regen/r"
    _ledger_run(sessions, output)
    env = cli_env(settings, s3_env)
    saved = json.loads(run_estimate(["--rows", "6", "--mean-output-tokens", "100", "--tokens-per-s", "0.02",
                                     "--save-as", "r", "--json"], env).stdout)
    assert saved["saved_to"] == f"{output}/estimate.json"
    result = json.loads(run_estimate(["--compare", "r", "--json"], env).stdout)
    rows = {r["metric"].strip(): r for r in result["rows"]}
    assert rows["output tokens"]["estimate"] == 600 and rows["output tokens"]["actual"] == 600
    assert run_estimate(["--rows", "6", "--mean-output-tokens", "1", "--tokens-per-s", "1", "--save-as", "nope"],
                        env, check=False).returncode != 0
