"""A sample that makes the engine exit is failed alone as ``engine_crash``, and no batch is charged (issue 58, item 4).

A real ``regen worker`` (launcher and worker process, restarted after each engine death) runs
the fake engine told to die when a conversation with ``POISON`` in it starts
(worker/engine/fake.py ``die_on``), on a benchmark run of three batches, one sample of which
is the poison. Before, the batch that saw each death first was charged a failure, and the
poison's batch died after its attempts with its innocent samples. Now every batch in flight
records its conversations in flight and is handed back; suspects run isolated, and the one
isolated at two deaths is failed alone (ledger/crash_suspects.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import text

from ledger.dispatch import make_celery
from ledger.objects import ObjectStore
from producer.run_config import build_run_config
from producer.submit import submit_run
from tests.faults.farm import FAST_RECOVERY, batches_by_status, settled
from tests.support.helpers import ROOT, cli_env, stop_process, wait_for

pytestmark = pytest.mark.slow

POISON = "POISON"
#: Not "poison": test_worker_faults.py's farm submits a run of that name (not a benchmark) to the same ledger.
RUN = "engine-poison"
#: 50 tokens a second per sequence, 20 tokens each: a sample runs 0.4 s, and 8 run at once.
ENGINE = f"tok_s=400,seqs=8,mean=20,sigma=0,die_on={POISON}"


def _write(path, n: int, poison_at: int) -> str:
    with path.open("w") as f:
        for i in range(n):
            content = f"{POISON} here" if i == poison_at else f"an ordinary prompt {i}"
            f.write(json.dumps({"id": f"p{i:03d}", "messages": [{"role": "user", "content": content}]}) + "\n")
    return f"p{poison_at:03d}"


def test_a_sample_that_kills_the_engine_is_failed_alone_within_three_deaths_and_no_batch_is_charged(
        settings, s3_env, s3_bucket, sessions, tmp_path):
    poison = _write(tmp_path / "poison.jsonl", 12, poison_at=6)
    submit_run(sessions, make_celery(settings), ObjectStore(), [str(tmp_path / "poison.jsonl")], run_name=RUN,
               config=build_run_config("tiny", max_tokens=100, seed=1), output_url=f"{s3_bucket}/{RUN}",
               batch_size=4, queue="regen", benchmark=True)
    log_path = tmp_path / "worker.log"
    log = lambda: log_path.read_text()  # noqa: E731
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "producer.cli", "worker", "--gpus", "none", "--concurrency", "3", "--node-name",
             "poison", "--fake-engine", ENGINE, *FAST_RECOVERY],
            env={**cli_env(settings, s3_env), "PYTHONUNBUFFERED": "1"}, stdout=log_file, stderr=subprocess.STDOUT,
            cwd=ROOT, start_new_session=True)
    try:
        wait_for(lambda: settled(sessions, RUN), timeout_s=240, interval_s=1, what="the run settled",
                 on_timeout=lambda: f"{batches_by_status(sessions, RUN)}\n{log()[-6000:]}")
    finally:
        stop_process(proc)
    deaths = log().count("FAKE ENGINE: dying on a poison prompt")
    with sessions() as s:
        batches = s.execute(text("SELECT b.seq, b.status, b.failures FROM batches b JOIN runs r ON r.id = b.run_id "
                                 "WHERE r.name = :run ORDER BY b.seq"), {"run": RUN}).all()
        samples = dict(s.execute(text("SELECT s.sample_id, s.status || coalesce(': ' || s.error, '') FROM samples s "
                                      "JOIN runs r ON r.id = s.run_id WHERE r.name = :run"), {"run": RUN}).all())
    assert 1 <= deaths <= 3, f"{deaths} engine deaths\n{log()[-6000:]}"
    assert [(b.status, b.failures) for b in batches] == [("done", 0)] * 3, f"{batches}\n{log()[-6000:]}"
    assert samples.pop(poison).startswith("failed: engine_crash"), log()[-6000:]
    assert set(samples.values()) == {"done"}, samples
