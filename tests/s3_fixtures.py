"""pytest plugin: a real moto S3 server over HTTP, its environment, fresh buckets, a fault proxy.

moto runs as a **subprocess** (``python -m moto.server``) on 127.0.0.1 and a free
port, once per session. A subprocess rather than a thread in pytest because
Celery worker subprocesses must reach the same server, and because a server
that competes with the tests for the GIL skews timing tests. Never in-process
``mock_aws``: regen's code must talk HTTP to S3 exactly as in production.

To let a worker subprocess use the same S3, pass it the ``s3_env`` dict::

    subprocess.Popen([...], env={**os.environ, **s3_env})

Buckets are unique per test, so tests never share state and the server is never reset.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from tests.s3_fault_proxy import FaultProxy

#: Seconds to wait for moto to answer; it imports all of moto on start (~1-3 s).
MOTO_START_TIMEOUT_S = 30.0


@dataclass
class MotoServer:
    endpoint_url: str
    process: subprocess.Popen[bytes]
    log_path: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.log_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # Linux: SIGTERM the server if pytest dies without running teardown (SIGKILL,
    # a crashed CI runner), so no orphaned moto holds a port forever.
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def start_moto_server(extra_env: dict[str, str] | None = None) -> MotoServer:
    """Start ``python -m moto.server`` on 127.0.0.1 and wait until it answers.

    ``extra_env`` configures moto itself, e.g. ``{"INITIAL_NO_AUTH_ACTION_COUNT": "3"}``
    to enforce IAM after three unauthenticated setup calls. The caller must ``stop()`` it.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(extra_env or {})
    last_error = ""
    for _ in range(3):  # the free port can be taken between probing and binding
        port = _free_port()
        log_fd, log_path = tempfile.mkstemp(prefix="moto-", suffix=".log")
        # stdout/stderr to a file: werkzeug logs every request and would fill a pipe and block.
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            preexec_fn=_die_with_parent,
        )
        os.close(log_fd)
        server = MotoServer(f"http://127.0.0.1:{port}", process, log_path)
        deadline = time.monotonic() + MOTO_START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"{server.endpoint_url}/moto-api/", timeout=1):
                    return server
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.1)
        with open(log_path, errors="replace") as f:
            last_error = f.read()[-2000:]
        server.stop()
    raise RuntimeError(f"moto server did not start:\n{last_error}")


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """The endpoint URL (``http://127.0.0.1:<port>``) of the session's moto server."""
    server = start_moto_server()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point boto3 (in this process) at moto; return the variables for subprocesses too."""
    env = {
        "AWS_ENDPOINT_URL": moto_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # Keep a developer's ~/.aws (profiles, addressing style, CA bundle) out of the tests.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3_bucket(s3_env: dict[str, str]) -> str:
    """A fresh, uniquely named bucket on the moto server, as ``s3://<bucket>``."""
    name = f"regen-test-{uuid.uuid4().hex[:16]}"
    _admin_client(s3_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)
    return f"s3://{name}"


@functools.lru_cache(maxsize=4)
def _admin_client(endpoint_url: str) -> Any:
    # Cached: a new boto3 session costs ~0.2 s of model loading, paid once instead of per test.
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                    region_name="us-east-1")
    return session.client("s3", endpoint_url=endpoint_url)


@pytest.fixture
def s3_fault_proxy(moto_server: str) -> Iterator[FaultProxy]:
    """A fault-injecting HTTP proxy in front of the moto server; point ``AWS_ENDPOINT_URL`` at
    ``proxy.endpoint_url`` to route a client through it."""
    with FaultProxy(moto_server) as proxy:
        yield proxy
