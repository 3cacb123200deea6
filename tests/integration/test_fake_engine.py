"""The fake engine (worker/engine/fake.py) in real worker processes: real Postgres, Redis, moto S3, Celery.

Seconds, not minutes: no vLLM. A fake worker serves a benchmark run (``regen submit --benchmark``)
and marks it fake everywhere; it refuses a real run's batches, so none of a real run is ever done
fake, and no export ever holds a fake row (issue 36, part 1).
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager

from sqlalchemy import text

from ledger.objects import ObjectStore
from producer.monitoring.metrics import collect
from tests.support.helpers import ROOT, cli_env, output_rows, run_cli, status_json, wait_for
from worker.engine.fake import FAKE_ENGINE_VERSION

SAMPLE = ROOT / "data" / "sample"
#: data/sample's samples, and its batches at --batch-size 16.
SAMPLES, BATCHES = 290, 19


@contextmanager
def _fake_worker(env: dict, log_path, name: str = "fake0@test"):
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "worker.process.consumer", "--name", name,
                                 "--fake-engine", "tok_s=20000,seqs=64,mean=100,sigma=1"],
                                env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log_file, stderr=subprocess.STDOUT,
                                cwd=ROOT, start_new_session=True)
        try:
            yield proc
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_a_fake_engine_worker_finishes_a_benchmark_run_marks_it_fake_and_export_keeps_none_of_it(
        settings, s3_env, s3_bucket, sessions, tiny_model, tmp_path):
    env = cli_env(settings, s3_env)
    output = f"{s3_bucket}/regen/fake"
    out = run_cli(["submit", str(SAMPLE), "--run", "fake", "--model", str(tiny_model), "--output", output,
                   "--batch-size", "16", "--max-tokens", "200", "--benchmark"], env)
    assert "benchmark run" in out.stdout
    log_path = tmp_path / "fake-worker.log"
    with _fake_worker(env, log_path):
        final = wait_for(lambda: (s := status_json(env, "fake"))["status"] == "finished" and s,
                         timeout_s=120, what="the fake run finished", interval_s=1,
                         on_timeout=lambda: log_path.read_text()[-3000:])
    assert final["samples"]["done"] == SAMPLES and final["samples"]["failed"] == 0
    assert final["fake"] == {"benchmark": True, "batches": BATCHES, "refusals": 0}
    assert "FAKE" in run_cli(["status", "--run", "fake"], env).stdout
    rows = output_rows(ObjectStore(), output)
    assert len({r["sample_id"] for r in rows}) == SAMPLES
    for row in rows:
        assert row["fake_engine"] == FAKE_ENGINE_VERSION
        assert 1 <= row["usage"]["completion_tokens"] <= 200
    with sessions() as s:
        engines = {json.dumps(p) for (p,) in s.execute(text("SELECT provenance FROM runs"))}
        marked = s.execute(text("SELECT bool_and(fake) FROM batches")).scalar_one()
    assert all(FAKE_ENGINE_VERSION in e for e in engines), engines
    assert marked is True
    assert "FAKE ENGINE" in log_path.read_text()

    # The tokens export (where a fake row used to crash on a missing "turn") refuses every fake row and says so.
    exported = run_cli(["export", "--run", "fake", "--format", "tokens", "--include-all", "--out",
                        str(tmp_path / "export")], env)
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["fake_rows_left_out"] == SAMPLES and manifest["counts"]["samples"] == 0
    assert manifest["left_out"]["samples"]["fake_engine"]["count"] == SAMPLES
    assert manifest["runs"][0]["benchmark"] is True
    assert f"{SAMPLES} samples made by the fake engine were left out" in exported.stderr
    assert not list((tmp_path / "export").rglob("*.jsonl"))
    # The report keeps its figures and flags where they come from.
    run_cli(["report", "--run", "fake", "--out", str(tmp_path / "report")], env)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["fake"]["benchmark_run"] is True and report["fake"]["fake_samples"] == SAMPLES
    assert f"FAKE      {SAMPLES} committed samples were made by the fake engine" in (
        tmp_path / "report" / "summary.txt").read_text()


def test_a_fake_engine_worker_on_a_real_runs_queue_does_none_of_it(settings, s3_env, s3_bucket, sessions,
                                                                   tiny_model, tmp_path):
    env = cli_env(settings, s3_env)
    output = f"{s3_bucket}/regen/real"
    run_cli(["submit", str(SAMPLE), "--run", "real", "--model", str(tiny_model), "--output", output,
             "--batch-size", "16", "--max-tokens", "200"], env)
    log_path = tmp_path / "fake-worker.log"
    with _fake_worker(env, log_path):
        # Every batch's message reached the fake worker at least once, and was refused.
        refused = wait_for(lambda: (s := status_json(env, "real"))["fake"]["refusals"] >= BATCHES and s,
                           timeout_s=90, what="the fake worker refused every batch", interval_s=1,
                           on_timeout=lambda: log_path.read_text()[-3000:])
        scrape = {m.name: m for m in collect(settings)}
    assert refused["fake"]["benchmark"] is False and refused["fake"]["batches"] == 0
    assert refused["samples"]["done"] == 0 and refused["samples"]["pending"] == SAMPLES
    refusals = [s.value for s in scrape["regen_fake_refusals"].samples if s.labels == {"run": "real"}]
    assert refusals and refusals[0] >= BATCHES
    with sessions() as s:
        batches = s.execute(text("SELECT status, attempts, failures, fake FROM batches")).all()
    # No attempt was ever taken (the claim refused it), so none counted a failure, and none is running.
    assert len(batches) == BATCHES
    assert {(b.status, b.attempts, b.failures, b.fake) for b in batches} == {("queued", 0, 0, False)}
    assert output_rows(ObjectStore(), output) == []
    log = log_path.read_text()
    assert "FAKE ENGINE refuses batch" in log and "not submitted with --benchmark" in log
    assert "FAKE" in run_cli(["status", "--run", "real"], env).stdout

    exported = run_cli(["export", "--run", "real", "--format", "tokens", "--include-all", "--out",
                        str(tmp_path / "export")], env)
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["fake_rows_left_out"] == 0 and manifest["counts"]["samples"] == 0
    assert "fake engine" not in exported.stderr
