"""deploy/slurm/regen-worker.sbatch, read as SLURM reads it: its directives and its shell.

The integration test (tests/integration/test_slurm.py) runs it against a real cluster; these
check, without one, the settings that decide whether a stopped job loses its batches' work.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support.helpers import ROOT
from worker.process.launcher import STOP_GRACE_S

SCRIPT = ROOT / "deploy" / "slurm" / "regen-worker.sbatch"


def directives() -> dict[str, str]:
    found = {}
    for line in SCRIPT.read_text().splitlines():
        if m := re.match(r"#SBATCH\s+--([\w-]+)(?:=(\S+))?", line):
            found[m[1]] = m[2] or ""
    return found


def test_the_time_limit_notice_reaches_the_batch_shell_long_before_the_end():
    signal = directives()["signal"]
    m = re.fullmatch(r"B:TERM@(\d+)", signal)
    assert m, f"--signal={signal}: the batch shell must get SIGTERM (B:) to forward it to the workers"
    # The launcher waits STOP_GRACE_S for its engines to stop before it kills them; the notice must
    # leave that much before SLURM's own SIGTERM/SIGKILL at the time limit.
    assert int(m[1]) > STOP_GRACE_S


def test_the_job_can_be_requeued_and_runs_one_worker_per_node():
    d = directives()
    assert "requeue" in d and d["ntasks-per-node"] == "1"
    assert d["open-mode"] == "append"  # a requeued job appends to its output instead of truncating it


def test_the_script_is_valid_bash_and_forwards_sigterm_to_the_steps_not_to_srun():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    assert subprocess.run([bash, "-n", str(SCRIPT)], capture_output=True).returncode == 0
    text = SCRIPT.read_text()
    # srun takes SIGTERM for "kill the step now" (SIGKILL): the hand-back would be skipped.
    assert 'scancel --signal=TERM "$job"' in text and "kill -TERM" not in text
    # An array task names itself <array>_<task>: its SLURM_JOB_ID may be the array's, which names them all.
    assert "job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" in text
