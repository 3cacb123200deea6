"""What a SLURM job tells ``regen worker``: the node, the GPUs it was given, when it ends.

Read once at start from SLURM's environment (and one ``squeue`` call for the time left, which
SLURM 22.05 puts in no variable; 23.02+ sets ``SLURM_JOB_END_TIME``). Outside a SLURM job
:func:`from_env` returns None and nothing here applies. What it found is printed in the
worker's start line, so a node's log says which job, node, GPUs and deadline it ran under.

Why each piece matters:

- **GPUs.** ``--gpus all`` means the job's allocation, not the node: SLURM sets
  ``CUDA_VISIBLE_DEVICES`` to the GPUs it allocated (renumbered from 0 where cgroups confine
  the devices), while ``nvidia-smi`` may list every GPU of a node shared with other jobs.
- **Node name.** Batches and Flower name a worker ``gpu0@<node>``; the SLURM node name plus
  the job and step ids (and the restart count of a requeued job) say which job ran a batch.
- **Time limit.** The worker stops taking new batches ``drain_s`` before the job's end, so
  those in flight can commit instead of being handed back half done at the end
  (deploy/slurm/regen-worker.sbatch's ``--signal=B:TERM@<grace>`` hands back what is left).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ledger.errors import ConfigError

log = logging.getLogger(__name__)

#: Seconds given to ``squeue`` (it asks slurmctld, which may be busy on a large cluster).
SQUEUE_TIMEOUT_S = 20.0

_TIME_LEFT = re.compile(r"^(?:(?P<days>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+)$")


def parse_time_left(text: str) -> float | None:
    """squeue's ``%L`` (``MM:SS``, ``HH:MM:SS``, ``D-HH:MM:SS``) in seconds; None for no limit.

    Raises:
        ConfigError: a value that is none of these (it names the value).
    """
    text = text.strip()
    if text.upper() in ("UNLIMITED", "NOT_SET", "INFINITE", "N/A", ""):
        return None
    m = _TIME_LEFT.match(text)
    if not m:
        raise ConfigError(f"squeue's time left {text!r} is not [D-][HH:]MM:SS")
    days, hours = int(m["days"] or 0), int(m["h"] or 0)
    return float(((days * 24 + hours) * 60 + int(m["m"])) * 60 + int(m["s"]))


def squeue_time_left(job_id: str) -> str:
    """``squeue -h -j JOB -o %L``: the job's time left as SLURM prints it."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%L"], capture_output=True, text=True,
                         timeout=SQUEUE_TIMEOUT_S, check=True).stdout
    return out.strip().splitlines()[0] if out.strip() else ""


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    #: ``SLURM_STEP_ID``: the srun step this worker runs in (absent in the batch step itself).
    step_id: str | None
    node: str
    #: The GPUs this step may use, as CUDA numbers them here (``CUDA_VISIBLE_DEVICES``); None: no GPU given.
    gpus: tuple[str, ...] | None
    #: Times a requeued job has started again (``SLURM_RESTART_COUNT``).
    restarts: int
    #: Wall-clock end of the job (epoch seconds); None without a time limit or when it could not be read.
    end_time: float | None
    array: str | None = None

    def node_name(self) -> str:
        """``n1-4242.0`` (node, job, step), ``n1-4242.0-r1`` after one requeue: unique per start."""
        name = f"{self.node}-{self.job_id}"
        if self.step_id is not None:
            name += f".{self.step_id}"
        if self.restarts:
            name += f"-r{self.restarts}"
        return name

    def stop_taking_at(self, drain_s: float, *, now: float) -> float | None:
        """When to stop taking new batches: ``drain_s`` before the end, but in the job's second half.

        A job shorter than twice the drain still works its first half instead of never taking a batch.
        """
        if self.end_time is None or drain_s <= 0:
            return None
        return max(now + (self.end_time - now) / 2, self.end_time - drain_s)

    def describe(self, *, now: float) -> str:
        """The start line's account of the job: ``slurm job 42.0 (array 40_2) on n1, restart 1, GPUs 0,1, 3599 s left``."""
        step = f"{self.job_id}.{self.step_id}" if self.step_id is not None else self.job_id
        parts = [f"slurm job {step}" + (f" (array {self.array})" if self.array else "") + f" on {self.node}"]
        if self.restarts:
            parts.append(f"restart {self.restarts}")
        parts.append(f"GPUs {','.join(self.gpus)}" if self.gpus else "no GPU allocated")
        parts.append(f"{self.end_time - now:.0f} s left" if self.end_time is not None else "no time limit")
        return ", ".join(parts)


def allocated_gpus(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The GPUs SLURM gave this step, as CUDA sees them; None when it gave none.

    SLURM sets ``CUDA_VISIBLE_DEVICES`` for a GPU allocation (``--gpus``, ``--gres=gpu:N``);
    ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS`` say only that there is one (their numbers are the
    node's, which differ from CUDA's under cgroup device confinement).
    """
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    allocated = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    if visible and visible not in ("NoDevFiles", "-1"):
        return tuple(g.strip() for g in visible.split(",") if g.strip())
    if allocated:
        return tuple(g.strip() for g in allocated.split(",") if g.strip())
    return None


def _end_time(env: Mapping[str, str], job_id: str, now: float,
              time_left: Callable[[str], str]) -> float | None:
    if env.get("SLURM_JOB_END_TIME", "").strip().isdigit():  # SLURM 23.02 and later
        end = float(env["SLURM_JOB_END_TIME"])
        return end if end > 0 else None
    try:
        left = parse_time_left(time_left(job_id))
    except (OSError, subprocess.SubprocessError, ConfigError, IndexError) as e:
        log.warning("could not read the time left of SLURM job %s (%s): taking batches until SIGTERM", job_id, e)
        return None
    return None if left is None else now + left


def from_env(env: Mapping[str, str] | None = None, *, now: float | None = None,
             time_left: Callable[[str], str] = squeue_time_left) -> SlurmJob | None:
    """The SLURM job this process runs in, or None outside one."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    now = time.time() if now is None else now
    node = env.get("SLURMD_NODENAME") or env.get("SLURM_TOPOLOGY_ADDR") or os.uname().nodename
    array = None
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        array = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    return SlurmJob(job_id=job_id, step_id=env.get("SLURM_STEP_ID"), node=node, gpus=allocated_gpus(env),
                    restarts=int(restarts) if restarts.isdigit() else 0,
                    end_time=_end_time(env, job_id, now, time_left), array=array)


@dataclass(frozen=True)
class NodePlan:
    """What ``regen worker`` runs with on this node, SLURM's job taken into account."""
    gpus: list[str] | None
    node_name: str | None
    stop_taking_at: float | None
    #: The start line's account of where the worker runs (empty outside SLURM).
    context: str


def plan_node(gpus_spec: str, node_name: str | None, drain_s: float, *, job: SlurmJob | None,
              now: float, parse_gpus: Callable[[str], list[str] | None]) -> NodePlan:
    """``--gpus``/``--node-name`` as given, or, in a SLURM job, from the job where they were left to it.

    Raises:
        ConfigError: ``--gpus all`` where the job was allocated no GPU and the node shows none.
    """
    if job is None:
        return NodePlan(parse_gpus(gpus_spec), node_name, None, "")
    if gpus_spec.strip().lower() == "all" and job.gpus:
        gpus: list[str] | None = list(job.gpus)  # the allocation, not every GPU nvidia-smi lists
    else:
        gpus = parse_gpus(gpus_spec)
    stop_at = job.stop_taking_at(drain_s, now=now)
    context = job.describe(now=now)
    if stop_at is not None:
        context += f", taking no new batch after {stop_at - now:.0f} s (drain {drain_s:.0f} s)"
    return NodePlan(gpus, node_name or job.node_name(), stop_at, context)
