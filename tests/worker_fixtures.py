"""pytest plugin: real ``regen worker`` processes (launcher + Celery worker + vLLM engine).

Each worker is started exactly as a user starts one, in its own session so a test
can signal it like a node's init system (SIGTERM) or a node crash (SIGKILL of
every process). Logs go to files the test prints when it fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

#: vLLM's CPU build loads the tiny model in ~20 s alone; two at once on two cores take longer.
READY_TIMEOUT_S = 300.0

#: vLLM's CPU build pins every engine's compute threads to core 0 by default ("auto" binding,
#: one core reserved for the frontend). Several engines in one test would then share one core
#: while the other idles; let the OS place them instead.
TEST_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass
class WorkerProc:
    name: str
    proc: subprocess.Popen
    log_path: Path
    env: dict[str, str] = field(repr=False, default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited early:\n{self.log()[-4000:]}")
            time.sleep(0.5)
        raise AssertionError(f"worker {self.name} not ready after {timeout_s}s:\n{self.log()[-4000:]}")

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def signal_worker(self, sig: int) -> None:
        """Signal the Celery worker process (the launcher's child), as an OOM killer or a node would."""
        children = psutil.Process(self.proc.pid).children()
        for child in children:
            os.kill(child.pid, sig)

    def kill_all(self) -> None:
        """A node crash: every process of this worker dies at once, with no chance to clean up."""
        for p in self.tree():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill_all()
        return self.proc.returncode


@pytest.fixture
def start_worker(settings, s3_env, tiny_model, tmp_path) -> Iterator:
    started: list[WorkerProc] = []

    def start(name: str | None = None, *, concurrency: int = 4, extra: list[str] | None = None,
              env: dict[str, str] | None = None, model: str | None = None) -> WorkerProc:
        name = name or f"w{len(started)}-{uuid.uuid4().hex[:4]}"
        log_path = tmp_path / f"worker-{name}.log"
        full_env = {**os.environ, **s3_env, "DATABASE_URL": settings.database_url,
                    "REDIS_URL": settings.redis_url, "PYTHONUNBUFFERED": "1", **TEST_ENGINE_ENV,
                    **(env or {})}
        argv = [sys.executable, "-m", "producer.cli", "worker", "--gpus", "none", "--concurrency",
                str(concurrency), "--node-name", name, "--model", model or str(tiny_model), "--engine-arg", "max_model_len=4096",
                *(extra or [])]
        log_file = open(log_path, "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, env=full_env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[1])
        worker = WorkerProc(name=name, proc=proc, log_path=log_path, env=full_env)
        started.append(worker)
        return worker

    yield start
    for w in started:
        w.stop(timeout_s=60)
        # Whatever the test did, leave no engine process behind.
        for p in w.tree():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
