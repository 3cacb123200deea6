"""``regen status`` imports only what it reads the ledger with, and prints what ``run_status`` returns.

A user runs ``regen status`` often and a 914K-sample ledger answers its queries in
~50 ms, so the command's time is Python's imports: SQLAlchemy alone costs ~0.2 s, the
broker, S3 and engine libraries more (docs/performance.md). The list below fails the
day a module-level import on the status path pulls one of them back in, which a timed
test on a shared machine could not tell from noise.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from sqlalchemy import text

from ledger import transitions
from producer.monitoring.status import run_status
from tests.support.helpers import ROOT

#: Top-level packages `regen status` must not import: SQLAlchemy (the status path reads with
#: psycopg alone, ledger/reads.py), the broker (Celery, kombu, redis), S3 (boto3), the input
#: readers' pyarrow and zstandard, and the engine's stack.
NOT_ON_THE_STATUS_PATH = {"sqlalchemy", "alembic", "celery", "kombu", "redis", "boto3", "botocore", "pyarrow",
                          "zstandard", "vllm", "torch", "transformers", "numpy"}

_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$")


def _run_with_samples(sessions) -> None:
    with sessions.begin() as s:
        run_id = s.execute(text(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
            "VALUES ('imports', 'm', '{\"max_tokens\": 8}', 'h', 's3://b/imports', 'regen', 4, 'active') "
            "RETURNING id")).scalar_one()
        batches = transitions.insert_batches(s, run_id, [(1, "k1", 4), (2, "k2", 4)])
        transitions.copy_pending_samples(s, run_id, ((f"s{i}", batches[i // 4], "f.jsonl", i + 1) for i in range(8)))
        s.execute(text("INSERT INTO rejected_rows (run_id, source_file, source_row, reason, detail) "
                       "VALUES (:r, 'f.jsonl', 9, 'malformed_json', 'x')"), {"r": run_id})


def _status_process(settings) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": settings.database_url}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "producer.cli", "status", "--run", "imports",
                           "--json"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_status_imports_neither_sqlalchemy_nor_broker_s3_or_engine(settings, sessions):
    _run_with_samples(sessions)
    proc = _status_process(settings)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {m.group(1) for line in proc.stderr.splitlines() if (m := _IMPORT_LINE.match(line))}
    assert "psycopg" in imported, "the importtime output was not parsed"
    top_level = {name.split(".")[0] for name in imported}
    assert not top_level & NOT_ON_THE_STATUS_PATH, f"regen status imported {sorted(top_level & NOT_ON_THE_STATUS_PATH)}"


def test_status_json_from_psycopg_equals_run_status_on_a_session(settings, sessions):
    # The command reads on a plain psycopg connection, the exporter and --watch on a Session:
    # the same queries (ledger/reads.py), so the same document.
    _run_with_samples(sessions)
    proc = _status_process(settings)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with sessions() as s:
        expected = json.loads(json.dumps({"runs": run_status(s, "imports")}, default=str))
    assert json.loads(proc.stdout) == expected
    assert expected["runs"][0]["samples"] == {"pending": 8, "done": 0, "failed": 0, "rejected": 1, "duplicates": 0}
