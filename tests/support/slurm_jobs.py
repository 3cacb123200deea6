"""Watching a SLURM job's processes from the test: every pid it ever had, on each "node".

``scontrol listpids`` asks the slurmd of the host it runs on, which it finds by the host name;
the test cluster's nodes are named in their ``NodeHostname``, so each node's list is read in a
UTS namespace of that name (``unshare --uts``, root). Recorded processes stay recorded when they
leave the job's tree (re-parented to init): that is how an orphan is still known as the job's.
psutil checks a recorded pid's start time, so a reused pid is never taken for one of them.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading

import psutil

from tests.support.slurm_cluster import SlurmCluster


def listpids(cluster: SlurmCluster, job_id: str, node: str) -> set[int] | None:
    """The pids ``scontrol listpids JOB`` shows on ``node``; None where it cannot be asked."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    scontrol = shutil.which("scontrol") or "scontrol"
    proc = subprocess.run([unshare, "--uts", "sh", "-c", f'hostname "$0" && exec {scontrol} listpids "$1"',
                           node, job_id], capture_output=True, text=True, env={**cluster.env(), "PATH": "/usr/bin:/bin"},
                          timeout=20)
    if "hostname" in proc.stderr or "unshare" in proc.stderr:
        return None
    pids = set()
    for line in proc.stdout.splitlines()[1:]:
        first = line.split()[0] if line.split() else ""
        if first.isdigit():
            pids.add(int(first))
    return pids


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class JobProcesses:
    """Every process SLURM listed for a job on its nodes, and their descendants, recorded every 0.3 s."""

    def __init__(self, cluster: SlurmCluster, job_id: str, nodes: tuple[str, ...]):
        self.cluster, self.job_id, self.nodes = cluster, job_id, nodes
        self._procs: dict[int, psutil.Process] = {}
        self.listed = 0  # how many pids listpids showed in all (0: it never answered with any)
        self.listpids_works = True
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"job-{job_id}-pids", daemon=True)
        self._thread.start()

    def _add(self, p: psutil.Process) -> None:
        if p.pid not in self._procs:
            self._procs[p.pid] = p

    def update(self) -> None:
        found: set[int] = set()
        for node in self.nodes:
            pids = listpids(self.cluster, self.job_id, node)
            if pids is None:
                self.listpids_works = False
                continue
            found |= pids
        with self._lock:
            self.listed += len(found - set(self._procs))
            for pid in found:
                with contextlib.suppress(psutil.NoSuchProcess):
                    self._add(psutil.Process(pid))
            for p in list(self._procs.values()):
                with contextlib.suppress(psutil.NoSuchProcess):
                    for child in p.children(recursive=True):
                        self._add(child)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            with contextlib.suppress(Exception):  # a slurmd busy for a moment: the next pass reads it
                self.update()

    def live(self) -> list[psutil.Process]:
        with self._lock:
            return [p for p in self._procs.values() if _alive(p)]

    def recorded(self) -> int:
        with self._lock:
            return len(self._procs)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
