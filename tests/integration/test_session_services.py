"""The test session's own servers (tests/support/embedded_services.py, tests/fixtures/services.py).

Each test here starts its servers in a folder of its own (``sessions_root``), whatever the
session uses, so it runs in every mode and touches nothing else: a restart keeps the
data on the same port, a killed session leaves no server behind and its folder goes at
the next start, and an explicit address that does not answer fails loudly instead of
being swapped for an embedded server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from local.s3 import free_port
from local.services import answers
from tests.support.embedded_services import EmbeddedServices, sweep_leftovers
from tests.support.helpers import ROOT, wait_for


@pytest.fixture
def sessions_root():
    """A parent for this test's session folders, as SESSIONS_ROOT is one: under the system's temporary folder.

    Not ``tmp_path``: pytest makes its folders private (0700), and as root the server's own
    user must reach its data folder; nothing outside a folder made for the purpose changes mode.
    """
    root = Path(tempfile.mkdtemp(prefix="regen_sessions_"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_stopped_server_starts_again_on_its_port_with_its_data(sessions_root):
    services = EmbeddedServices(root=sessions_root)
    try:
        pg = services.start_postgres()
        with psycopg.connect(pg.admin_dsn, autocommit=True) as c:
            c.execute("CREATE TABLE kept (n int)")
            c.execute("INSERT INTO kept VALUES (7)")
        pg.stop()
        assert not answers("127.0.0.1", pg.port)
        pg.start()
        with psycopg.connect(pg.admin_dsn) as c:
            assert c.execute("SELECT n FROM kept").fetchall() == [(7,)]

        r = services.start_redis()
        client = redis.Redis(port=r.port)
        client.set("k", "v")
        r.stop()
        assert not answers("127.0.0.1", r.port)
        r.start()
        assert client.get("k") is None, "Redis keeps nothing on disk: a restart empties it"
        client.close()
        folder = pg.session.path
    finally:
        services.close()
    assert not answers("127.0.0.1", pg.port) and not answers("127.0.0.1", r.port)
    assert not folder.exists()


SESSION_THAT_DIES = """
import json, os, sys
from pathlib import Path
from tests.support.embedded_services import EmbeddedServices
services = EmbeddedServices(root=Path(sys.argv[1]))
pg, r = services.start_postgres(), services.start_redis()
print(json.dumps({"pids": [pg.proc.pid, r.proc.pid], "ports": [pg.port, r.port],
                  "folder": str(pg.session.path)}), flush=True)
os.kill(os.getpid(), 9)  # a crash: no teardown, no atexit
"""


def test_a_killed_session_leaves_no_server_and_the_next_start_removes_its_folder(sessions_root):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SESSION_THAT_DIES, str(sessions_root)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    started = json.loads(proc.stdout)
    # The kernel told both servers that their parent died (PR_SET_PDEATHSIG).
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                             for p in started["pids"]), timeout_s=60, what="the servers of the killed session to stop",
             interval_s=0.2)
    assert not any(answers("127.0.0.1", port) for port in started["ports"])
    folder = sessions_root / os.path.basename(started["folder"])
    assert folder.exists(), "nobody removed the folder yet"
    assert sweep_leftovers(sessions_root) == [folder]
    assert not folder.exists()


def test_the_sweep_stops_a_leftover_process_of_a_dead_session_and_spares_live_sessions(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os, psutil; print(psutil.Process().create_time())"],
                          capture_output=True, text=True, check=True)
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        gone = tmp_path / "1-dead"
        gone.mkdir()
        # The owner's pid is checked with its start time: a reused pid is not mistaken for it.
        (gone / "owner.json").write_text(json.dumps({"pid": os.getpid(), "started": float(dead.stdout)}))
        (gone / "postgres.pid.json").write_text(json.dumps(
            {"pid": leftover.pid, "started": psutil.Process(leftover.pid).create_time()}))
        live = tmp_path / "2-live"
        live.mkdir()
        (live / "owner.json").write_text(json.dumps({"pid": os.getpid(), "started": psutil.Process().create_time()}))
        assert sweep_leftovers(tmp_path) == [gone]
        assert not psutil.pid_exists(leftover.pid), "the leftover was killed (and reaped by the sweep)"
        assert not gone.exists() and live.exists()
    finally:
        if leftover.poll() is None:
            leftover.kill()


#: A quick test that needs the session's Postgres (and nothing else).
ONE_DATABASE_TEST = ("tests/integration/test_schema_check.py", "-k", "behind_or_ahead")


def _pytest(env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGEN_TEST_") and k != "CI"}
    env.update(env_extra, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def test_an_explicit_address_that_does_not_answer_fails_loudly_and_nothing_is_started_instead():
    closed = free_port()
    out = _pytest({"REGEN_TEST_PG": f"postgresql://127.0.0.1:{closed}/test"},
                  *ONE_DATABASE_TEST)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 error" in out.stdout and "skipped" not in out.stdout
    assert f"Postgres at postgresql://127.0.0.1:{closed}/test (REGEN_TEST_PG) is not usable" in out.stdout
    assert "never replaced by an embedded server" in out.stdout
    assert "services (REGEN_TEST_SERVICES=auto)" in out.stdout and "none used" in out.stdout

    both = _pytest({"REGEN_TEST_SERVICES": "embedded", "REGEN_TEST_REDIS": f"redis://127.0.0.1:{closed}/0"},
                   *ONE_DATABASE_TEST)
    assert both.returncode == 4 and "contradict each other" in both.stderr, both.stdout + both.stderr
    typo = _pytest({"REGEN_TEST_SERVICES": "embeded"}, *ONE_DATABASE_TEST)
    assert typo.returncode == 4 and "expected one of auto, embedded" in typo.stderr, typo.stdout + typo.stderr


def test_embedded_mode_uses_servers_of_its_own_and_says_so():
    started = time.monotonic()
    out = _pytest({"REGEN_TEST_SERVICES": "embedded"}, *ONE_DATABASE_TEST)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "services (REGEN_TEST_SERVICES=embedded)" in out.stdout
    assert "Postgres: embedded: PostgreSQL" in out.stdout, out.stdout
    assert time.monotonic() - started < 120
