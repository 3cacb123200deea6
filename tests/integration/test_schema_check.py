"""A worker refuses a ledger at another migration than its own, at start, saying what to run."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from ledger import migrate
from ledger.errors import ConfigError
from ledger.settings import Settings
from tests.support.helpers import ROOT


@pytest.fixture
def scratch_db(pg_server):
    with pg_server.bare_database("regen_schema") as dsn:
        yield Settings(database_url=dsn)


def test_a_ledger_behind_or_ahead_of_the_code_is_refused(scratch_db):
    with pytest.raises(ConfigError, match=r"at migration \(none\).*regen db upgrade"):
        migrate.require_head(scratch_db)
    migrate.upgrade(scratch_db, "0003")
    with pytest.raises(ConfigError, match=f"at migration 0003, this regen needs {migrate.head()}"):
        migrate.require_head(scratch_db)
    migrate.upgrade(scratch_db)
    migrate.require_head(scratch_db)  # at head: nothing to say
    with psycopg.connect(scratch_db.database_url, autocommit=True) as c:
        c.execute("UPDATE alembic_version SET version_num = '0099'")
    with pytest.raises(ConfigError, match="0099, which this regen .* does not know"):
        migrate.require_head(scratch_db)


def test_regen_worker_stops_before_starting_anything_on_an_old_ledger(scratch_db):
    migrate.upgrade(scratch_db, "0003")
    proc = subprocess.run([sys.executable, "-m", "producer.cli", "worker", "--gpus", "none"], cwd=ROOT, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "DATABASE_URL": scratch_db.database_url})
    assert proc.returncode != 0
    assert "regen db upgrade" in proc.stderr and "worker" not in proc.stdout
