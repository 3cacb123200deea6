"""The whole worker path with the fake engine (worker/engine/fake.py): real Postgres, Redis, moto S3, Celery.

Seconds, not minutes: no vLLM. Also checks that a fake batch says so in its rows and provenance.
"""

from __future__ import annotations

import json
import subprocess
import sys

from sqlalchemy import text

from ledger.objects import ObjectStore
from tests.support.helpers import ROOT, cli_env, output_rows, run_cli, status_json, wait_for
from worker.engine.fake import FAKE_ENGINE_VERSION

SAMPLE = ROOT / "data" / "sample"


def test_a_fake_engine_worker_finishes_a_run_and_marks_it_fake(settings, s3_env, s3_bucket, sessions,
                                                              tiny_model, tmp_path):
    env = cli_env(settings, s3_env)
    output = f"{s3_bucket}/regen/fake"
    run_cli(["submit", str(SAMPLE), "--run", "fake", "--model", str(tiny_model), "--output", output,
             "--batch-size", "16", "--max-tokens", "200", "--json"], env)
    log_path = tmp_path / "fake-worker.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "worker.process.consumer", "--name", "fake0@test",
                                 "--fake-engine", "tok_s=20000,seqs=64,mean=100,sigma=1"],
                                env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log_file, stderr=subprocess.STDOUT,
                                cwd=ROOT, start_new_session=True)
        try:
            final = wait_for(lambda: (s := status_json(env, "fake"))["status"] == "finished" and s,
                             timeout_s=120, what="the fake run finished", interval_s=1,
                             on_timeout=lambda: log_path.read_text()[-3000:])
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert final["samples"]["done"] == 290 and final["samples"]["failed"] == 0
    rows = output_rows(ObjectStore(), output)
    assert len({r["sample_id"] for r in rows}) == 290
    for row in rows:
        assert row["fake_engine"] == FAKE_ENGINE_VERSION
        assert 1 <= row["usage"]["completion_tokens"] <= 200
    with sessions() as s:
        engines = {json.dumps(p) for (p,) in s.execute(text("SELECT provenance FROM runs"))}
    assert all(FAKE_ENGINE_VERSION in e for e in engines), engines
    assert "FAKE ENGINE" in log_path.read_text()
