"""A real SLURM cluster on this machine: munged, slurmctld and two slurmd, all in one temp folder.

Debian's ``slurm-wlm`` (22.05) and ``munge``, configured here and nowhere else: the munge key,
its socket, slurm.conf, the state, spool, pid and log files all live under ``root``, the ports
are free ones, so it touches no system service and several can run side by side. Two ``slurmd``
on 127.0.0.1 with a ``NodeName`` and ``Port`` each is the usual way to have two "nodes" on one
host. Client commands find it through ``SLURM_CONF`` (``env()``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The binaries the cluster needs (Debian packages slurm-wlm and munge).
REQUIRED = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun")
SBIN = ("/usr/sbin", "/sbin")


def which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN:
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    return None


def missing_binaries() -> list[str]:
    return [b for b in REQUIRED if which(b) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    root: Path
    nodes: tuple[str, ...] = ("n1", "n2")
    #: CPUs each node offers: one job per node at a time is what the test wants (--exclusive anyway).
    cpus_per_node: int = 2
    #: What SLURM gives a job between SIGTERM and SIGKILL when it cancels one: SLURM's default,
    #: the time a worker has to hand back and stop its engine on a plain `scancel`.
    kill_wait_s: int = 30
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    def env(self) -> dict[str, str]:
        """What a client command (sbatch, squeue, scancel) needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    # -- start ----------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", [which("slurmctld"), "-D", "-f", str(self.conf)])
        for node in self.nodes:
            (self.root / f"spool-{node}").mkdir(exist_ok=True)
            self._spawn(f"slurmd-{node}", [which("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
        self._wait_nodes_idle(timeout_s)

    def _start_munge(self) -> None:
        d = self.root / "munge"
        d.mkdir(mode=0o700, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        # munged refuses a socket folder others can write, and keys readable by others; --force
        # gets it past the checks of folders it does not own here (/tmp's sticky bit).
        self._spawn("munged", [which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
                               f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"])
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists():
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{self.log('munged')}")
            time.sleep(0.05)

    def _write_conf(self) -> None:
        r = self.root
        ctld_port = _free_port()
        lines = [
            "ClusterName=regentest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire also holds a requeued job back (its begin time is now + cred_expire + 1):
            # 120 s by default, 10 here so a requeued job starts again within the test.
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool-%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups in a container: processes are tracked by their parent chain, tasks unbound.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            # Its main loop every second (default 60): a requeued job's begin time passes unseen otherwise.
            "SchedulerParameters=sched_interval=1",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "ReturnToService=2",
            f"KillWait={self.kill_wait_s}",
            "JobRequeue=1",
            "MinJobAge=300",
            "InactiveLimit=0",
            # The nodes report what the conf says, not what this machine has.
            "SlurmdParameters=config_overrides",
        ]
        for node in self.nodes:
            lines.append(f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={node} Port={_free_port()} "
                         f"CPUs={self.cpus_per_node} RealMemory=2000 State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=NO")
        (r / "state").mkdir(exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list) -> None:
        out = open(self.root / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT,
                                            env={**os.environ, **self.env()}, start_new_session=True)

    def _wait_nodes_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}:\n{self.log(name)}")
            states = self.node_states()
            if states and all(s.startswith("idle") for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not idle after {timeout_s}s: {states}\n{self.log('slurmctld')}")
            time.sleep(0.2)

    # -- commands -------------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout_s: float = 30) -> subprocess.CompletedProcess:
        proc = subprocess.run([which(argv[0]) or argv[0], *argv[1:]], capture_output=True, text=True,
                              env={**os.environ, **(env or {}), **self.env()}, cwd=cwd, timeout=timeout_s)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, RestartCnt, NodeList, ...); {} once it is forgotten."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        fields: dict[str, str] = {}
        for token in out.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def log(self, name: str) -> str:
        texts = []
        for suffix in (".log", ".out"):
            p = self.root / f"{name}{suffix}"
            if p.exists():
                texts.append(p.read_text(errors="replace")[-4000:])
        return "\n".join(texts)

    # -- stop -----------------------------------------------------------------------------------
    def stop(self) -> None:
        # Jobs first, so slurmd's steps end their processes; then the daemons, newest first.
        self.run("scancel", "--full", "--signal=KILL", "--user=root", check=False)
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=15)
