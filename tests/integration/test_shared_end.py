"""A run's end is shared: a worker that took the whole run hands back what it has not started to one that starves.

Two real worker processes with the fake engine (worker/engine/fake.py), real Postgres, Redis,
moto S3 and Celery. Worker A starts alone and, left to its defaults (128 sequences: 16 batches
of 64 held), takes the whole run of 16 batches; its gate lets 128 conversations (2 batches) in
at once, so 14 batches wait in it, held but not started. Each conversation takes ~4 s (100
tokens at 25 tokens/s per sequence), so A alone needs at least 1,024 x 4 / 128 = 32 s. Worker B
starts once A holds everything. Without worker/batches/holding.py's backlog bound B would idle until the
run ended; with it A hands back the batches beyond its share and B generates them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.faults.farm import batches_by_status, settled, write_prompts
from tests.fixtures.fault_report import account
from tests.support.helpers import ROOT, cli_env, run_cli, wait_for

pytestmark = [pytest.mark.slow]

BATCHES, BATCH_SIZE, SEQS, SECONDS = 16, 64, 128, 4
#: 25 tokens/s per sequence, 100-token answers (sigma 0.1: a short tail): ~4 s each, 128 at once.
FAKE = f"tok_s={SEQS * 25},seqs={SEQS},mean=100,sigma=0.1"
#: A alone cannot finish faster than its engine's full rate allows.
ALONE_S = BATCHES * BATCH_SIZE * SECONDS / SEQS


def _worker(name: str, env: dict, log_path: Path) -> subprocess.Popen:
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "worker.process.consumer", "--name", name, "--fake-engine", FAKE,
                             "--heartbeat-s", "1"], env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log_file,
                            stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def _held_by(sessions, run: str) -> dict[str, int]:
    with sessions() as s:
        return dict(s.execute(text(
            "SELECT b.worker, count(*) FROM batches b JOIN runs r ON r.id = b.run_id "
            "WHERE r.name = :n AND b.status = 'running' GROUP BY 1"), {"n": run}).all())


def test_a_worker_that_took_the_whole_run_hands_unstarted_batches_to_a_late_worker(settings, s3_env, s3_bucket,
                                                                                  sessions, tiny_model, tmp_path):
    env = cli_env(settings, s3_env)
    expected = write_prompts(tmp_path / "shared.jsonl", BATCHES * BATCH_SIZE, prefix="e")
    assert len(expected) == BATCHES * BATCH_SIZE
    logs = {n: tmp_path / f"worker-{n}.log" for n in ("a", "b")}
    procs = [_worker("a@shared", env, logs["a"])]
    try:
        wait_for(lambda: " ready." in logs["a"].read_text(errors="replace"), timeout_s=60, what="worker a ready",
                 interval_s=0.5, on_timeout=lambda: logs["a"].read_text()[-3000:])
        start = int(re.search(r"holding up to (\d+) batches \(max_num_seqs", logs["a"].read_text()).group(1))
        assert start >= BATCHES, f"A's start ({start}) must cover the whole run"
        run_cli(["submit", str(tmp_path / "shared.jsonl"), "--run", "shared", "--model", str(tiny_model),
                 "--output", f"{s3_bucket}/shared", "--batch-size", str(BATCH_SIZE), "--max-tokens", "200",
                 "--quality-thresholds", '{"gate_overridden": true}', "--benchmark"], env)
        wait_for(lambda: _held_by(sessions, "shared") == {"a@shared": BATCHES}, timeout_s=30,
                 what="A holds the whole run", interval_s=0.2,
                 on_timeout=lambda: f"{_held_by(sessions, 'shared')}\n{logs['a'].read_text()[-3000:]}")
        procs.append(_worker("b@shared", env, logs["b"]))
        wait_for(lambda: settled(sessions, "shared"), timeout_s=90, what="every batch settled", interval_s=1,
                 on_timeout=lambda: f"{batches_by_status(sessions, 'shared')}\n{logs['a'].read_text()[-3000:]}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
    with sessions() as s:
        done_by = dict(s.execute(text(
            "SELECT b.worker, count(*) FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = 'shared' "
            "AND b.status = 'done' GROUP BY 1")).all())
        first, last, handed = s.execute(text(
            "SELECT min(b.started_at), max(b.finished_at), sum(b.attempts - 1) FROM batches b "
            "JOIN runs r ON r.id = b.run_id WHERE r.name = 'shared'")).one()
        failures = s.execute(text("SELECT coalesce(sum(failures), 0) FROM batches")).scalar_one()
    log_a = logs["a"].read_text()
    assert "handing back" in log_a, log_a[-3000:]
    # B generated part of the run: what A handed back (started_at is each batch's last claim).
    assert done_by.get("b@shared", 0) >= 5, done_by
    assert sum(done_by.values()) == BATCHES
    assert handed >= 5 and failures == 0, "a hand-back is a new attempt, never a failure"
    span_s = (last - first).total_seconds()
    assert span_s < 0.85 * ALONE_S, f"the run took {span_s:.1f} s; A alone needs at least {ALONE_S:.1f} s"
    row = account(sessions, "shared", expected_ids=expected)
    assert (row.done, row.lost, row.dup_ledger, row.dup_outputs) == (len(expected), 0, 0, 0)
