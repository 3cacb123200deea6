"""What ``regen worker`` reads from a SLURM job's environment (worker/process/slurm.py).

These are SLURM's variables as its daemons set them (the integration test, tests/integration/
test_slurm.py, reads them from a real slurmd); here each rule is checked on its own.
"""

from __future__ import annotations

import threading
import time

import pytest

from ledger.errors import ConfigError
from worker.process import slurm
from worker.process.deadline import watch_deadline
from worker.process.launcher import parse_gpus, plan_processes

NOW = 1_800_000_000.0
JOB = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "gpu-a07"}


def _never(job_id: str) -> str:
    raise AssertionError("squeue must not be asked")


@pytest.mark.parametrize(("text", "seconds"), [
    ("59:30", 3570), ("1:00:00", 3600), ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5), ("0:07", 7),
    ("UNLIMITED", None), ("NOT_SET", None)])
def test_squeue_time_left_is_read_in_each_of_its_forms(text, seconds):
    assert slurm.parse_time_left(text) == seconds


def test_a_time_left_of_no_known_form_is_refused_with_the_value():
    with pytest.raises(ConfigError, match="'soon'"):
        slurm.parse_time_left("soon")


def test_outside_a_job_nothing_is_read():
    assert slurm.from_env({"PATH": "/usr/bin"}, now=NOW, time_left=_never) is None


def test_the_job_end_comes_from_squeue_on_slurm_22():
    asked = []
    job = slurm.from_env(JOB, now=NOW, time_left=lambda j: asked.append(j) or "1:00:00")
    assert asked == ["4242"]
    assert job.end_time == NOW + 3600
    assert job.node_name() == "gpu-a07-4242.0"


def test_slurm_job_end_time_wins_where_slurm_sets_it():
    job = slurm.from_env({**JOB, "SLURM_JOB_END_TIME": str(int(NOW) + 600)}, now=NOW, time_left=_never)
    assert job.end_time == NOW + 600


def test_an_unreadable_time_left_means_no_deadline_not_a_refusal():
    def broken(job_id: str) -> str:
        raise OSError("squeue: command not found")

    job = slurm.from_env(JOB, now=NOW, time_left=broken)
    assert job.end_time is None and job.stop_taking_at(600, now=NOW) is None
    assert "no time limit" in job.describe(now=NOW)


def test_a_requeued_job_names_its_workers_for_the_restart():
    job = slurm.from_env({**JOB, "SLURM_RESTART_COUNT": "2", "SLURM_ARRAY_JOB_ID": "4240",
                          "SLURM_ARRAY_TASK_ID": "2"}, now=NOW, time_left=lambda j: "UNLIMITED")
    assert job.node_name() == "gpu-a07-4242.0-r2"
    assert job.describe(now=NOW) == "slurm job 4242.0 (array 4240_2) on gpu-a07, restart 2, no GPU allocated, no time limit"


def test_gpus_all_is_the_allocation_as_cuda_numbers_it():
    # Under cgroup device confinement SLURM_JOB_GPUS has the node's numbers, CUDA sees 0 and 1.
    env = {**JOB, "SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"}
    job = slurm.from_env(env, now=NOW, time_left=lambda j: "UNLIMITED")
    node = slurm.plan_node("all", None, 600, job=job, now=NOW, parse_gpus=parse_gpus)
    assert node.gpus == ["0", "1"] and node.node_name == "gpu-a07-4242.0"
    plans = plan_processes(node.gpus, tp=2, host=node.node_name, base_env={})
    assert [(p.name, p.env["CUDA_VISIBLE_DEVICES"]) for p in plans] == [("gpu0-1@gpu-a07-4242.0", "0,1")]
    assert "GPUs 0,1" in node.context


def test_explicit_flags_win_over_the_job():
    job = slurm.from_env({**JOB, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, now=NOW, time_left=lambda j: "UNLIMITED")
    node = slurm.plan_node("2,3", "mine", 600, job=job, now=NOW, parse_gpus=parse_gpus)
    assert node.gpus == ["2", "3"] and node.node_name == "mine"
    assert slurm.plan_node("none", None, 600, job=job, now=NOW, parse_gpus=parse_gpus).gpus is None


def test_no_batch_is_taken_in_the_drain_before_the_end_but_always_in_the_first_half():
    job = slurm.from_env(JOB, now=NOW, time_left=lambda j: "2:00:00")
    assert job.stop_taking_at(600, now=NOW) == NOW + 7200 - 600
    short = slurm.from_env(JOB, now=NOW, time_left=lambda j: "10:00")
    assert short.stop_taking_at(600, now=NOW) == NOW + 300  # half of a job shorter than twice the drain
    assert job.stop_taking_at(0, now=NOW) is None
    node = slurm.plan_node("none", None, 600, job=job, now=NOW, parse_gpus=parse_gpus)
    assert node.stop_taking_at == NOW + 6600
    assert "7200 s left, taking no new batch after 6600 s (drain 600 s)" in node.context


def test_at_the_deadline_the_worker_stops_taking_and_cancels_its_consumers_until_it_succeeds():
    stop_taking, stopping = threading.Event(), threading.Event()
    calls = []

    def cancel() -> bool:
        calls.append(time.time())
        if len(calls) == 1:
            raise ConnectionError("broker away")
        return True

    thread = watch_deadline(time.time(), stop_taking=stop_taking, stopping=stopping, cancel=cancel,
                            held=lambda: 3, name="cpu0@n1-1.0", retry_s=0.05)
    thread.join(timeout=10)
    assert stop_taking.is_set() and len(calls) == 2 and not thread.is_alive()


def test_a_worker_stopping_before_the_deadline_never_stops_taking():
    stop_taking, stopping = threading.Event(), threading.Event()
    thread = watch_deadline(time.time() + 3600, stop_taking=stop_taking, stopping=stopping,
                            cancel=lambda: True, held=lambda: 0, name="cpu0@n1-1.0")
    stopping.set()
    thread.join(timeout=5)
    assert not thread.is_alive() and not stop_taking.is_set()
