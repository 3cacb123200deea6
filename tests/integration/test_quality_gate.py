"""The quality gate against a real ledger: pause after K classified samples, rate-limited evaluation,
``resume`` refused while the gate would pause again, ``--force`` overriding it for good."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from ledger.quality import GateRefused, enforce_gate, evaluate_gate, pause_run, resume_run
from producer.monitoring.status import run_status


def make_run(sessions, *, thresholds: dict | None = None, status: str = "active", batch_status: str = "queued"
             ) -> int:
    with sessions.begin() as s:
        run_id = s.execute(text(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status, "
            "quality_thresholds) VALUES ('gated', 'm', '{}', :h, 's3://b/gated', 'regen', 64, :status, "
            "CAST(:t AS jsonb)) RETURNING id"),
            {"h": "a" * 64, "status": status, "t": None if thresholds is None else json.dumps(thresholds)}
        ).scalar_one()
        s.execute(text("INSERT INTO batches (run_id, seq, status, input_key, n_samples) "
                       "VALUES (:run, 0, :status, 's3://b/gated/inputs/0', 64)"),
                  {"run": run_id, "status": batch_status})
    return run_id


def add_samples(sessions, run_id: int, quality: str, n: int, *, start: int) -> None:
    with sessions.begin() as s:
        s.execute(text(
            "INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status, quality) "
            "SELECT :run, 's' || g, (SELECT id FROM batches WHERE run_id = :run), 'a.jsonl', g, "
            "CASE WHEN :q = 'failed' THEN 'failed' ELSE 'done' END, :q FROM generate_series(CAST(:a AS int), CAST(:b AS int)) g"),
            {"run": run_id, "q": quality, "a": start, "b": start + n - 1})


def status_of(sessions, run_id: int) -> tuple[str, str | None]:
    with sessions() as s:
        return tuple(s.execute(text("SELECT status, status_reason FROM runs WHERE id = :r"), {"r": run_id}).one())


def test_the_gate_pauses_a_stub_run_once_it_has_enough_samples(sessions):
    run_id = make_run(sessions, thresholds={"gate_min_samples": 20, "gate_interval_s": 0})
    add_samples(sessions, run_id, "stub_answer", 15, start=0)
    decision = enforce_gate(sessions, run_id)
    assert decision is not None and not decision.pause and "too few" in decision.reason
    assert status_of(sessions, run_id)[0] == "active"

    add_samples(sessions, run_id, "ok", 5, start=100)
    decision = enforce_gate(sessions, run_id)
    assert decision.pause and decision.classified == 20
    status, reason = status_of(sessions, run_id)
    assert status == "paused"
    assert "stub_answer+empty_answer 75.0% > 20%" in reason and "regen resume" in reason
    with sessions() as s:  # regen status says why
        assert "75.0%" in run_status(s, "gated")[0]["status_reason"]


def test_workers_evaluate_a_run_at_most_once_per_interval(sessions):
    run_id = make_run(sessions, thresholds={"gate_min_samples": 5})  # default interval: 15 s
    add_samples(sessions, run_id, "ok", 5, start=0)
    assert enforce_gate(sessions, run_id) is not None
    add_samples(sessions, run_id, "empty_answer", 50, start=100)
    assert enforce_gate(sessions, run_id) is None  # not due: the stubs wait for the next interval
    with sessions.begin() as s:
        s.execute(text("UPDATE runs SET gate_checked_at = now() - interval '16 seconds' WHERE id = :r"),
                  {"r": run_id})
    assert enforce_gate(sessions, run_id).pause
    assert status_of(sessions, run_id)[0] == "paused"


def test_resume_is_refused_while_the_gate_would_pause_again_and_force_overrides_it(sessions):
    run_id = make_run(sessions, thresholds={"gate_min_samples": 10, "gate_interval_s": 0})
    add_samples(sessions, run_id, "truncated_answer", 8, start=0)
    add_samples(sessions, run_id, "ok", 4, start=100)
    assert enforce_gate(sessions, run_id).pause

    with pytest.raises(GateRefused, match=r"truncated_reasoning\+truncated_answer 66.7% > 30%.*--force"):
        with sessions.begin() as s:
            resume_run(s, "gated", force=False)
    assert status_of(sessions, run_id)[0] == "paused"

    with sessions.begin() as s:
        result = resume_run(s, "gated", force=True)
    assert result.status == "active" and "overridden" in result.message
    assert status_of(sessions, run_id) == ("active", None)
    add_samples(sessions, run_id, "truncated_answer", 100, start=1000)
    assert enforce_gate(sessions, run_id) is None  # overridden: never paused again
    with sessions() as s:
        decision = evaluate_gate(s, run_id)
    assert not decision.pause and "overridden" in decision.reason
    assert status_of(sessions, run_id)[0] == "active"


def test_resume_without_force_works_once_the_thresholds_allow_the_run(sessions):
    run_id = make_run(sessions, thresholds={"gate_min_samples": 10, "gate_interval_s": 0})
    add_samples(sessions, run_id, "stub_answer", 5, start=0)
    add_samples(sessions, run_id, "ok", 5, start=100)
    assert enforce_gate(sessions, run_id).pause
    with sessions.begin() as s:  # a human decides that short answers are fine for this dataset
        s.execute(text("UPDATE runs SET quality_thresholds = quality_thresholds || "
                       "'{\"gate\": {\"stub_answer+empty_answer\": 0.6}}' WHERE id = :r"), {"r": run_id})
    with sessions.begin() as s:
        result = resume_run(s, "gated", force=False)
    assert result.status == "active" and "overridden" not in result.message
    with sessions() as s:
        stored = s.execute(text("SELECT quality_thresholds FROM runs WHERE id = :r"), {"r": run_id}).scalar()
    assert "gate_overridden" not in stored


def test_a_run_whose_batches_all_finished_while_paused_resumes_as_finished(sessions):
    run_id = make_run(sessions, status="paused", batch_status="done")
    with sessions.begin() as s:
        assert resume_run(s, "gated", force=False).status == "finished"
    with sessions.begin() as s:
        assert "not paused" in resume_run(s, "gated", force=False).message
        assert not pause_run(s, run_id, "finished runs are not paused")
    assert status_of(sessions, run_id)[0] == "finished"


def test_resuming_an_unknown_run_is_a_config_error(sessions):
    from ledger.errors import ConfigError

    with pytest.raises(ConfigError, match="no run named"), sessions.begin() as s:
        resume_run(s, "nope", force=False)
