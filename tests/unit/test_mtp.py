"""MTP as a priced option (worker/engine/mtp.py): lossless engine arguments, the acceptance, the estimate's choice."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ledger.errors import ConfigError
from producer.estimate import estimator
from producer.estimate.estimator import EstimateOptions, ProbeError, build_estimate, mtp_probe
from producer.estimate.render import render_estimate
from producer.estimate.sample import draw_sample
from producer.run_config import RunConfig
from tests.unit.test_estimate_math import _chat, _probe_for, _write_dataset
from worker.engine.args import parse_engine_args
from worker.engine.mtp import (
    AcceptanceRecorder,
    choose_mtp,
    mtp_engine_arg_pairs,
    mtp_tokens_of,
    parse_mtp,
    speculative_config,
)


def test_the_draft_is_sampled_and_verified_so_the_output_is_the_targets():
    spec = speculative_config(2)
    assert spec == {"method": "mtp", "num_speculative_tokens": 2, "draft_sample_method": "probabilistic",
                    "rejection_sample_method": "standard"}
    # The worker's --mtp travels as an --engine-arg pair and reads back as the same engine argument.
    assert parse_engine_args(mtp_engine_arg_pairs(2)) == {"speculative_config": spec}
    assert mtp_tokens_of(parse_engine_args(mtp_engine_arg_pairs(3))) == 3 and mtp_tokens_of({}) == 0
    with pytest.raises(ConfigError):
        speculative_config(0)


@pytest.mark.parametrize(("given", "tokens"), [(None, None), ("auto", None), ("off", 0), ("0", 0), ("on", 2), ("3", 3)])
def test_mtp_option_reads_auto_off_on_or_a_count(given, tokens):
    assert parse_mtp(given) == tokens


@pytest.mark.parametrize("bad", ["many", "-1", "9"])
def test_a_bad_mtp_option_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match="--mtp"):
        parse_mtp(bad)


def test_the_acceptance_is_summed_from_vllms_spec_decoding_stats():
    recorder = AcceptanceRecorder()
    for drafts, drafted, accepted in ((10, 20, 15), (10, 20, 9)):
        spec = SimpleNamespace(num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted)
        recorder.record(SimpleNamespace(spec_decoding_stats=spec), None)
    recorder.record(SimpleNamespace(spec_decoding_stats=None), None)  # a step without drafts
    assert recorder.as_record() == {"drafted_tokens": 40, "accepted_tokens": 24, "acceptance_rate": 0.6,
                                    "tokens_per_target_step": 2.2}


def test_the_choice_is_the_cheaper_unless_told():
    faster = {"tokens_per_s": 150.0, "mtp": {"acceptance_rate": 0.7}}
    slower = {"tokens_per_s": 80.0, "mtp": {"acceptance_rate": 0.2}}
    on = choose_mtp(None, model_layers=1, rate_without=100.0, mtp_probe=faster)
    assert on.tokens == 2 and "1.50x" in on.reason and "70% of drafted tokens accepted" in on.reason
    off = choose_mtp(None, model_layers=1, rate_without=100.0, mtp_probe=slower)
    assert not off.on and "off is the cheaper" in off.reason
    assert choose_mtp(3, model_layers=1, rate_without=100.0, mtp_probe=slower).tokens == 3  # told: kept on
    assert "off as asked" in choose_mtp(0, model_layers=1, rate_without=100.0, mtp_probe=faster).reason
    assert "no MTP head" in choose_mtp(None, model_layers=0, rate_without=100.0, mtp_probe=None).reason
    with pytest.raises(ConfigError, match="no MTP layer"):
        choose_mtp(2, model_layers=0, rate_without=100.0, mtp_probe=None)


def _model(tmp_path, mtp_layers: int) -> RunConfig:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"text_config": {"mtp_num_hidden_layers": mtp_layers}}))
    return RunConfig(model=str(model), max_tokens=512, sampling={"temperature": 0.6})


def _drawn(tmp_path):
    _write_dataset(tmp_path / "a.jsonl", [_chat(i, 1, 5) for i in range(100)])
    return draw_sample([str(tmp_path / "a.jsonl")], 20, seed=1)


def test_the_estimate_prices_the_run_with_mtp_where_it_is_cheaper_and_says_why(tmp_path):
    drawn, config = _drawn(tmp_path), _model(tmp_path, 1)
    probe = _probe_for(drawn, lambda c: 100)  # 100 tok/s without MTP
    with_mtp = {**_probe_for(drawn, lambda c: 100, tps=160.0), "mtp": {"tokens": 2, "acceptance_rate": 0.65}}
    doc = build_estimate(drawn, probe, config, EstimateOptions(sample_size=20), inputs=["a"], mtp_results=with_mtp)
    assert doc["mtp"]["on"] and doc["tokens_per_s"] == 160.0
    assert doc["work_hours"]["value"] == pytest.approx(20 * 100 * 5 / 160.0 / 3600)  # 100 rows, 100 tokens each
    assert "MTP on, 2 tokens drafted a step: 160 tok/s with it against 100 without (1.60x" in render_estimate(doc)


def test_where_the_engine_cannot_run_mtp_the_estimate_says_so_and_prices_without_it(tmp_path, monkeypatch):
    drawn, config = _drawn(tmp_path), _model(tmp_path, 1)

    def engine_without_mtp(*args, **kwargs):
        raise ProbeError("the probe exited with 1:\nerrors: NotImplementedError: speculative decoding is not "
                         "supported on this platform\nlast output:\n...")

    monkeypatch.setattr(estimator, "run_probe_subprocess", engine_without_mtp)
    failed = mtp_probe(drawn, config, EstimateOptions(sample_size=20))
    assert failed == {"error": "NotImplementedError: speculative decoding is not supported on this platform"}
    doc = build_estimate(drawn, _probe_for(drawn, lambda c: 100), config, EstimateOptions(sample_size=20),
                         inputs=["a"], mtp_results=failed)
    assert not doc["mtp"]["on"] and doc["tokens_per_s"] == 100.0
    assert "MTP off: MTP could not run here (NotImplementedError: speculative" in render_estimate(doc)
    assert "priced without it" in doc["mtp"]["reason"]


def test_no_mtp_probe_runs_for_a_model_without_a_head_or_when_told_off(tmp_path, monkeypatch):
    drawn = _drawn(tmp_path)
    monkeypatch.setattr(estimator, "run_probe_subprocess", lambda *a, **k: pytest.fail("no probe should run"))
    assert mtp_probe(drawn, _model(tmp_path, 0), EstimateOptions()) is None
    assert mtp_probe(drawn, _model(tmp_path, 1), EstimateOptions(mtp=0)) is None
    doc = build_estimate(drawn, _probe_for(drawn, lambda c: 100), _model(tmp_path, 0), EstimateOptions(),
                         inputs=["a"])
    assert "MTP off: the model has no MTP head" in render_estimate(doc)


def test_a_run_with_mtp_records_it_in_its_config_hash_and_provenance():
    plain = RunConfig(model="/m", max_tokens=512, sampling={"temperature": 0.6})
    with_mtp = RunConfig(model="/m", max_tokens=512, sampling={"temperature": 0.6}, mtp_tokens=2)
    assert "mtp_tokens" not in plain.as_record() and "mtp" not in plain.provenance()  # as before MTP existed
    assert with_mtp.as_record()["mtp_tokens"] == 2 and with_mtp.hash != plain.hash
    assert with_mtp.provenance()["mtp"] == {"tokens": 2, "speculative_config": speculative_config(2)}


def test_submit_refuses_mtp_for_a_model_without_a_head_and_auto_is_off_for_a_run(tmp_path):
    from producer.run_config import _mtp_tokens

    no_head, head = tmp_path / "no_head", tmp_path / "head"
    for path, layers in ((no_head, 0), (head, 1)):
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"text_config": {"mtp_num_hidden_layers": layers}}))
    with pytest.raises(ConfigError, match="declares no MTP layer"):
        _mtp_tokens(str(no_head), "2")
    assert _mtp_tokens(str(head), "2") == 2 and _mtp_tokens(str(head), "auto") == 0 and _mtp_tokens(str(head), "on") == 2


def test_a_worker_whose_engine_drafts_otherwise_refuses_the_run_and_builds_with_the_runs_choice():
    import threading

    from worker.engine.mtp import mtp_engine_args
    from worker.process.runtime import WorkerRuntime, WrongModel

    rt = WorkerRuntime.__new__(WorkerRuntime)  # its engine only: no ledger, broker or store needed here
    rt._engine_lock, rt._build_error, rt._renderer = threading.Lock(), None, object()
    rt.options = SimpleNamespace(fake_engine=None, engine_args={})
    rt._engine = SimpleNamespace(model="/m", chosen_args=mtp_engine_args(2))
    assert rt.engine_for("/m", mtp=2)[0] is rt._engine
    assert rt.engine_for("/m")[0] is rt._engine  # a --model preload asks nothing
    with pytest.raises(WrongModel, match="drafts 2 MTP tokens a step and the run asks for 0"):
        rt.engine_for("/m", mtp=0)


def test_the_named_cause_is_vllms_error_without_its_log_prefix(tmp_path, monkeypatch):
    # What the CPU build says of a tiny hybrid declaring an MTP layer whose checkpoint lacks its weights.
    def no_head_weights(*args, **kwargs):
        raise ProbeError("the probe exited with 1:\nerrors: EngineDeadError: EngineCore encountered an issue.\n"
                         "        (Worker pid=15225) ERROR 12-06 22:15:34 "
                         "[multiproc_executor.py:953] ValueError: Following weights were not initialized from "
                         "checkpoint: {'model.norm.weight'}\nlast output:\n...")

    monkeypatch.setattr(estimator, "run_probe_subprocess", no_head_weights)
    failed = mtp_probe(_drawn(tmp_path), _model(tmp_path, 1), EstimateOptions(sample_size=20))
    assert failed == {"error": "ValueError: Following weights were not initialized from checkpoint: "
                               "{'model.norm.weight'}"}


def test_a_root_cause_logged_before_a_long_tail_of_tracebacks_is_kept():
    # vLLM's CPU build, MTP at top-k 20: the worker's error, then thousands of lines of aborted requests.
    import sys
    from pathlib import Path

    from producer.estimate.probe_run import KEPT_LINES, run_streaming

    script = ("import sys\nprint('(Worker pid=1) ERROR RuntimeError: index -472793528 is out of bounds', flush=True)\n"
              f"for i in range({KEPT_LINES + 500}): print('  File x, line', i)\n"
              "print('EngineDeadError: EngineCore encountered an issue.')\nsys.exit(1)\n")
    code, output = run_streaming([sys.executable, "-c", script], timeout_s=60, cwd=Path.cwd(), env=None,
                                 show=lambda line: None)
    assert code == 1 and "RuntimeError: index -472793528 is out of bounds" in output
    cause = estimator.probe_failure(output)
    assert cause.index("RuntimeError: index") < cause.index("EngineDeadError")
