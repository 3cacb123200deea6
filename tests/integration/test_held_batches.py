"""A worker left to its defaults holds more batches while its engine starves, never more than its ceiling.

Real Celery, Redis, Postgres and a CPU engine: ``max_num_seqs`` 8 makes the derived start
3 batches (worker/engine/admission.py assumes batches of 64), and this run's batches hold 4
conversations each, so 3 of them leave the engine short of work with nobody waiting at
the admission gate: exactly what worker/batches/holding.py must answer by raising Celery's
prefetch count. The ledger shows what the worker held at once.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from tests.faults.farm import batches_by_status, settled, write_prompts
from tests.fixtures.fault_report import account
from tests.support.helpers import cli_env, run_cli, wait_for
from worker.batches.holding import CEILING
from worker.engine.admission import batches_to_hold

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _spans(sessions, run: str) -> list[tuple]:
    with sessions() as s:
        return s.execute(text("SELECT b.started_at, b.finished_at FROM batches b JOIN runs r ON r.id = b.run_id "
                              "WHERE r.name = :n AND b.status = 'done'"), {"n": run}).all()


def _most_held_at_once(spans: list[tuple], *, within_s: float | None = None) -> int:
    """The most batches between claim and commit at one moment (in the first ``within_s`` seconds)."""
    first = min(start for start, _ in spans)
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    held = most = 0
    for at, step in events:
        if within_s is not None and (at - first).total_seconds() > within_s:
            break
        held += step
        most = max(most, held)
    return most


def test_a_starving_engine_makes_the_worker_hold_more_batches_up_to_its_ceiling(settings, s3_env, s3_bucket,
                                                                              sessions, start_worker, tmp_path):
    start = batches_to_hold(8)
    assert start == 3
    env = cli_env(settings, s3_env)
    expected = write_prompts(tmp_path / "held.jsonl", 320, prefix="h")
    w = start_worker("h", concurrency=0, extra=["--engine-arg", "max_num_seqs=8"])
    w.wait_ready()
    assert f"holding up to {start} batches (max_num_seqs 8; grown up to {start * CEILING}" in w.log()
    run_cli(["submit", str(tmp_path / "held.jsonl"), "--run", "held", "--model", w.model, "--output",
             f"{s3_bucket}/held", "--batch-size", "4", "--max-tokens", "96", "--seed", "3",
             "--quality-thresholds", '{"gate_overridden": true}'], env)
    wait_for(lambda: settled(sessions, "held"), timeout_s=900, what="every batch settled", interval_s=1,
             on_timeout=lambda: f"{batches_by_status(sessions, 'held')}\n{w.log()[-4000:]}")
    grown = [int(n) for n in re.findall(r"holding up to (\d+) batches \(was \d+\)", w.log())]
    assert grown, f"the worker never held more than its start:\n{w.log()[-4000:]}"
    assert grown == sorted(grown) and grown[-1] <= start * CEILING
    spans = _spans(sessions, "held")
    most = _most_held_at_once(spans)
    assert start < most <= start * CEILING, f"held {most} batches at once (start {start}, grown to {grown})"
    # The start is enforced: 80 batches were queued, yet in the first 1.9 s (one window: at most
    # one growth) the worker held no more than start + 1, not the 12 threads its pool has.
    early = _most_held_at_once(spans, within_s=1.9)
    assert early <= start + 1, f"held {early} batches at once in the run's first 1.9 s (start {start})"
    row = account(sessions, "held", expected_ids=expected)
    assert (row.done, row.lost, row.dup_ledger, row.dup_outputs) == (320, 0, 0, 0)
