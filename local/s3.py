"""A local S3: moto's server in a subprocess, for the demo, the tests and the benchmarks.

regen talks HTTP to S3 exactly as in production, so these use ``python -m
moto.server`` on 127.0.0.1 (never an in-process ``mock_aws``): worker subprocesses
reach the same server, and a server in its own process does not compete with the
caller for the GIL. Nothing here imports moto; starting the server needs the
``dev`` extra (``moto[server]``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from worker.process.orphans import die_with_parent

#: Seconds to wait for moto to answer; it imports all of moto on start (~1-3 s, more on a loaded machine).
MOTO_START_TIMEOUT_S = 30.0


@dataclass
class LocalS3:
    endpoint_url: str
    process: subprocess.Popen[bytes]
    log_path: str
    #: Remove the log file on stop (a temporary file); False for a log the caller keeps.
    own_log: bool = True

    def env(self) -> dict[str, str]:
        """The variables that point boto3 (this process's or a subprocess's) at this server."""
        return local_s3_env(self.endpoint_url)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.own_log:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log_path)


def local_s3_env(endpoint_url: str) -> dict[str, str]:
    """The variables that point boto3 at a local S3 served at ``endpoint_url``."""
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # Keep a developer's ~/.aws (profiles, addressing style, CA bundle) out of it.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_local_s3(extra_env: dict[str, str] | None = None, *, log_path: str | None = None,
                   start_timeout_s: float = MOTO_START_TIMEOUT_S) -> LocalS3:
    """Start ``python -m moto.server`` on 127.0.0.1 and a free port; return once it answers.

    Args:
        extra_env: configures moto itself, e.g. ``{"INITIAL_NO_AUTH_ACTION_COUNT": "3"}``
            to enforce IAM after three unauthenticated setup calls.
        log_path: where the server logs (kept); default a temporary file removed on ``stop()``.
        start_timeout_s: how long to wait for it to answer.

    The caller must ``stop()`` it.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(extra_env or {})
    last_error = ""
    for _ in range(3):  # the free port can be taken between probing and binding
        port = free_port()
        if log_path is None:
            log_fd, path = tempfile.mkstemp(prefix="moto-", suffix=".log")
        else:
            log_fd, path = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), log_path
        # stdout/stderr to a file: werkzeug logs every request and would fill a pipe and block.
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            preexec_fn=die_with_parent,
        )
        os.close(log_fd)
        server = LocalS3(f"http://127.0.0.1:{port}", process, path, own_log=log_path is None)
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"{server.endpoint_url}/moto-api/", timeout=1):
                    return server
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.1)
        with open(path, errors="replace") as f:
            last_error = f.read()[-2000:]
        server.stop()
    raise RuntimeError(f"moto server did not start:\n{last_error}")
