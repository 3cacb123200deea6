"""``regen worker``: one worker process per GPU group on this node, supervised.

The launcher owns each child's session: when a child dies (even by SIGKILL,
leaving vLLM's engine processes orphaned and holding memory) the launcher kills
the rest of its session, then restarts it with back-off. On SIGTERM/SIGINT it
forwards SIGTERM to every child (each hands its in-flight batches back to the
broker), waits, and reaps the sessions. Should the launcher itself die (SIGKILL,
the OOM killer), its reaper (worker/process/reaper.py) stops every process of its
children's sessions within 20 s.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from ledger.dispatch import DEFAULT_QUEUE
from ledger.errors import ConfigError
from worker.engine.build_errors import EXIT_ENGINE_NEVER_BUILDS
from worker.process import reaper
from worker.process.orphans import LAUNCHER_PID_ENV, die_with_parent
from worker.process.reaper import TAG_ENV

log = logging.getLogger("regen.launcher")

#: Restart back-off for a crashing child: 2 s doubling to 5 min. A child that ran
#: this long counts as healthy again (its next crash starts from 2 s).
RESTART_BASE_S = 2.0
RESTART_MAX_S = 300.0
HEALTHY_AFTER_S = 600.0
#: Consecutive quick crashes after which the launcher gives up on a child and
#: exits non-zero: a crash loop is a bug for a human, not something to retry forever.
MAX_QUICK_CRASHES = 8
#: Time given to children to hand back their batches and stop the engine after SIGTERM.
STOP_GRACE_S = 60.0
#: How long a launcher that stops cleanly waits for its reaper to check for leftovers and exit.
REAPER_EXIT_WAIT_S = 15.0


@dataclass(frozen=True)
class ProcessPlan:
    name: str
    devices: tuple[str, ...]
    env: dict[str, str]
    argv: tuple[str, ...]


def discover_gpus() -> list[str]:
    """GPU indices on this node from nvidia-smi (empty when there is none)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def parse_gpus(spec: str) -> list[str] | None:
    """``none`` → None (one CPU engine); ``all`` → discovered; ``0,1,2,3`` → as given."""
    spec = spec.strip().lower()
    if spec in ("none", "cpu", ""):
        return None
    if spec == "all":
        gpus = discover_gpus()
        if not gpus:
            raise ConfigError("--gpus all: no GPU found (nvidia-smi failed or listed none)")
        return gpus
    gpus = [g.strip() for g in spec.split(",") if g.strip()]
    if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise ConfigError(f"--gpus expects none, all or distinct indices like 0,1,2,3 (got {spec!r})")
    return gpus


def plan_processes(gpus: list[str] | None, *, tp: int = 1, host: str | None = None, queues: str = DEFAULT_QUEUE,
                   concurrency: int = 0, model: str | None = None, engine_args: list[str] | None = None,
                   extra_args: list[str] | None = None, base_env: dict[str, str] | None = None,
                   metrics_port: int = 0,
                   python: str = sys.executable) -> list[ProcessPlan]:
    """The processes this node should run: pure, so it is tested without GPUs."""
    host = host or socket.gethostname()
    env_base = dict(base_env if base_env is not None else os.environ)
    engine_args = list(engine_args or [])
    if gpus is None:
        groups: list[tuple[str, ...]] = [()]
    else:
        if tp < 1 or len(gpus) % tp:
            raise ConfigError(f"{len(gpus)} GPUs cannot be split into tensor-parallel groups of {tp}")
        groups = [tuple(gpus[i:i + tp]) for i in range(0, len(gpus), tp)]
    plans = []
    for i, devices in enumerate(groups):
        env = dict(env_base)
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
            name = f"gpu{devices[0]}@{host}" if tp == 1 else f"gpu{'-'.join(devices)}@{host}"
            args = list(engine_args)
            if tp > 1 and not any(a.startswith("tensor_parallel_size=") for a in args):
                args.append(f"tensor_parallel_size={tp}")
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
            # vLLM's CPU build sizes its KV cache from this (GiB); its default is small.
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
            name = f"cpu{i}@{host}"
            args = list(engine_args)
        argv = [python, "-m", "worker.process.consumer", "--name", name, "--queues", queues,
                "--concurrency", str(concurrency)]
        if model:
            argv += ["--model", model]
        for a in args:
            argv += ["--engine-arg", a]
        if metrics_port:
            argv += ["--metrics-port", str(metrics_port + i)]
        argv += list(extra_args or [])
        plans.append(ProcessPlan(name=name, devices=devices, env=env, argv=tuple(argv)))
    return plans


@dataclass
class _Child:
    plan: ProcessPlan
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    quick_crashes: int = 0
    next_start: float = 0.0
    gave_up: bool = False
    starts: int = 0
    tag: str = ""
    log_lines: list[str] = field(default_factory=list)


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Reaper:
    """worker/process/reaper.py's process: stops this launch's processes once the launcher is gone."""

    def __init__(self, launch_id: str):
        self.launch_id = launch_id
        self.proc: subprocess.Popen | None = None
        self._write_end: int | None = None
        self._sessions: set[int] = set()

    def start(self) -> None:
        read_end, self._write_end = os.pipe()  # both close-on-exec: no child but the reaper holds one
        env = {k: v for k, v in os.environ.items() if k != TAG_ENV}
        # A session of its own: a signal to the launcher's group (Ctrl-C) does not reach it, and no
        # PDEATHSIG: it must outlive the launcher to do its work.
        self.proc = subprocess.Popen([sys.executable, "-m", "worker.process.reaper", self.launch_id], stdin=read_end,
                                     env=env, start_new_session=True)
        os.close(read_end)
        for sid in self._sessions:
            self._say(f"+{sid}")

    def _say(self, line: str) -> None:
        if self._write_end is None:
            return
        try:
            os.write(self._write_end, f"{line}\n".encode())
        except OSError:  # the reaper died: keep_alive starts another and tells it every session
            pass

    def watch(self, session: int) -> None:
        self._sessions.add(session)
        self._say(f"+{session}")

    def forget(self, session: int) -> None:
        self._sessions.discard(session)
        self._say(f"-{session}")

    def keep_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            log.warning("the reaper (pid %d) exited with %s; starting another", self.proc.pid, self.proc.returncode)
            self.close()
            self.start()

    def close(self, wait_s: float = 0.0) -> None:
        """Close the pipe (the reaper then checks for leftovers and exits); wait for it up to ``wait_s``."""
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=wait_s) if wait_s else self.proc.poll()
            except subprocess.TimeoutExpired:
                log.warning("the reaper (pid %d) is still running", self.proc.pid)


class Launcher:
    def __init__(self, plans: list[ProcessPlan]):
        self.children = [_Child(p) for p in plans]
        self.stopping = False
        #: Unique to this launcher: what its reaper and its own clean-up find its processes by.
        self.launch_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.reaper = _Reaper(self.launch_id)

    def _start(self, child: _Child) -> None:
        # A new session: the child and every engine process it spawns share one session we can kill,
        # and the reaper, told its id, kills it should this launcher die at any moment of the child's
        # life (before its engine loads, during, after). The tag covers the instant before it is told.
        # And tied to this launcher: if it dies (kill -9, OOM), the child gets SIGTERM, hands its
        # batches back and stops its engine, instead of claiming work and holding a GPU unsupervised.
        child.starts += 1
        child.tag = f"{self.launch_id}/{self.children.index(child)}.{child.starts}"
        env = {**child.plan.env, LAUNCHER_PID_ENV: str(os.getpid()), TAG_ENV: child.tag}
        child.proc = subprocess.Popen(list(child.plan.argv), env=env, start_new_session=True,
                                      preexec_fn=die_with_parent)
        self.reaper.watch(child.proc.pid)  # its session id: what the reaper stops should we die
        child.started_at = time.monotonic()
        log.info("started %s (pid %d, devices %s)", child.plan.name, child.proc.pid,
                 ",".join(child.plan.devices) or "cpu")

    def _on_exit(self, child: _Child, code: int) -> None:
        assert child.proc is not None
        # Reap orphaned engine processes: the rest of its session, and anything carrying its tag.
        if leftovers := reaper.kill(child.tag, {child.proc.pid}):
            log.warning("%s left %d processes behind; killed them", child.plan.name, leftovers)
        self.reaper.forget(child.proc.pid)
        ran_s = time.monotonic() - child.started_at
        child.proc = None
        if self.stopping:
            return
        if code == EXIT_ENGINE_NEVER_BUILDS:
            # No restart builds it: the same args and files fail the same way (worker/engine/build_errors.py).
            log.error("%s stopped: its engine can never be built (its last line says why); not restarting it",
                      child.plan.name)
            child.gave_up = True
            return
        child.quick_crashes = 0 if ran_s >= HEALTHY_AFTER_S else child.quick_crashes + 1
        if child.quick_crashes >= MAX_QUICK_CRASHES:
            log.error("%s crashed %d times in a row; giving up on it", child.plan.name, child.quick_crashes)
            child.gave_up = True
            return
        delay = min(RESTART_MAX_S, RESTART_BASE_S * 2 ** max(0, child.quick_crashes - 1))
        child.next_start = time.monotonic() + delay
        log.warning("%s exited with %s after %.0fs; restarting in %.0fs", child.plan.name, code, ran_s, delay)

    def stop(self, *_: object) -> None:
        if self.stopping:
            return
        self.stopping = True
        log.info("stopping: asking every worker to hand back its batches")
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self.reaper.start()  # before any child: from the first child's fork on, a death is covered
        try:
            return self._supervise()
        finally:
            self.reaper.close(wait_s=REAPER_EXIT_WAIT_S)

    def _supervise(self) -> int:
        for child in self.children:
            self._start(child)
        stop_deadline = None
        while True:
            self.reaper.keep_alive()
            now = time.monotonic()
            for child in self.children:
                if child.proc is not None:
                    code = child.proc.poll()
                    if code is not None:
                        self._on_exit(child, code)
                elif not self.stopping and not child.gave_up and now >= child.next_start:
                    self._start(child)
            if self.stopping:
                stop_deadline = stop_deadline or now + STOP_GRACE_S
                alive = [c for c in self.children if c.proc is not None]
                if not alive:
                    return 0
                if now > stop_deadline:
                    for c in alive:
                        log.warning("%s did not stop in %.0fs; killing its group", c.plan.name, STOP_GRACE_S)
                        _kill_group(c.proc.pid, signal.SIGKILL)
            elif all(c.gave_up for c in self.children):
                return 1
            time.sleep(0.2)


def run_launcher(plans: list[ProcessPlan], *, context: str = "") -> int:
    """Run ``plans`` until SIGTERM; ``context`` (a SLURM job's node, GPUs, time left) goes in the start line."""
    # force: the `regen` command configured WARNING-level logging before it knew it would launch workers.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    log.info("regen worker: %d process%s (%s)%s", len(plans), "" if len(plans) == 1 else "es",
             ", ".join(p.name for p in plans), f"; {context}" if context else "")
    return Launcher(plans).run()
