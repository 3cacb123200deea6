"""A worker past its SLURM job's drain point takes no batch, and the run still finishes elsewhere.

Worker a runs with the variables a SLURM 23.02+ job sets (``SLURM_JOB_END_TIME`` among them; on
22.05 the end comes from squeue, tests/integration/test_slurm.py), its job ending 2 s after it
starts with a 1 s drain: by the time its engine is loaded it is past the point where it stops
taking batches. It must cancel its Celery consumer (worker/process/deadline.py) and hand back
unclaimed whatever was delivered meanwhile; worker b, outside any job, does the whole run.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from tests.faults.farm import FAST_RECOVERY, batches_by_status, settled, write_prompts
from tests.fixtures.fault_report import account
from tests.support.helpers import cli_env, run_cli, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_a_worker_past_its_jobs_drain_point_claims_nothing_and_stops_consuming(
        settings, s3_env, s3_bucket, sessions, start_worker, tmp_path, fault_report):
    env = cli_env(settings, s3_env)
    expected = write_prompts(tmp_path / "drain.jsonl", 48, prefix="d")
    job_env = {"SLURM_JOB_ID": "7001", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "na",
               "SLURM_JOB_END_TIME": str(int(time.time()) + 2)}
    a = start_worker("a", env=job_env, extra=[*FAST_RECOVERY, "--drain-before-end-s", "1"])
    b = start_worker("b", extra=FAST_RECOVERY)
    logs = lambda: "\n".join(w.name + ":\n" + w.log()[-3000:] for w in (a, b))  # noqa: E731
    a.wait_ready()
    b.wait_ready()
    wait_for(lambda: "stopped consuming" in a.log(), timeout_s=120, what="a cancelling its consumer",
             interval_s=0.5, on_timeout=logs)
    assert "slurm job 7001.0 on na, no GPU allocated," in a.log() and "taking no new batch after" in a.log()
    run_cli(["submit", str(tmp_path / "drain.jsonl"), "--run", "drain", "--model", a.model, "--output",
             f"{s3_bucket}/drain", "--batch-size", "4", "--max-tokens", "32", "--seed", "2",
             "--quality-thresholds", '{"gate_overridden": true}'], env)
    wait_for(lambda: settled(sessions, "drain"), timeout_s=900, what="every batch settled", interval_s=1,
             on_timeout=lambda: f"{batches_by_status(sessions, 'drain')}\n{logs()}")
    with sessions() as s:
        by_worker = dict(s.execute(text(
            "SELECT b.worker, count(*) FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = 'drain' "
            "GROUP BY b.worker")).all())
        attempts = s.execute(text(
            "SELECT sum(attempts) FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = 'drain'")).scalar()
    assert by_worker == {"cpu0@b": 12}, by_worker
    assert attempts == 12, "a claimed a batch after its drain point (an extra attempt)"
    assert "attempt 1 started" not in a.log()
    row = fault_report("worker past its job's drain point", account(sessions, "drain", expected_ids=expected))
    assert row.lost == 0 and row.dup_ledger == 0 and row.dup_outputs == 0 and row.done == 48
