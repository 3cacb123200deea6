"""A submit appended to a run while workers commit it: no deadlock, nothing aborted (issue 58, item 2).

Before migration 0011 a commit locked the run's pending-count row (the samples trigger of
migration 0005) and then the ``runs`` row (migration 0009's trigger), while a submit group
took them in the other order: Postgres aborted submit groups with "deadlock detected", and
``regen submit`` failed. The ledger's counters are now sharded by batch, and every writer
takes them in one order (docs/ledger.md, "The commit path").
"""

from __future__ import annotations

import json
import threading
import time

from sqlalchemy import text

from ledger import transitions
from tests.support.helpers import cli_env, run_cli
from worker.batches.ledger_calls import commit_batch

BATCH_SIZE = 16
FIRST_ROWS = 1_000
APPENDED_ROWS = 20_000


def _write(path, first: int, last: int):
    with path.open("a") as f:
        for i in range(first, last):
            f.write(json.dumps({"id": f"u{i}", "messages": [{"role": "user", "content": f"hello {i}"}]}) + "\n")
    return path


def _deadlocks(sessions) -> int:
    with sessions() as s:
        return int(s.execute(text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"))
                   .scalar())


def _committer(sessions, run_id: int, stop: threading.Event, committed: list[int], errors: list[BaseException],
               name: str) -> None:
    """A worker's ledger side, as fast as it goes: claim the next waiting batch, commit its samples."""
    try:
        while not stop.is_set():
            with sessions.begin() as s:
                batch = s.execute(text("SELECT id FROM batches WHERE run_id = :r AND status IN ('planned', 'queued') "
                                       "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"), {"r": run_id}).scalar()
                attempt = None if batch is None else transitions.claim(s, batch, worker=name, lease_s=60)
                ids = [] if attempt is None else s.execute(text(
                    "SELECT sample_id FROM samples WHERE batch_id = :b"), {"b": batch}).scalars().all()
            if attempt is None:
                time.sleep(0.01)
                continue
            rows = [{"sample_id": sid, "status": "done", "finish_reason": "stop", "turns": 1, "tool_calls": 0,
                     "quality": "ok", "usage": {"prompt_tokens": 10, "completion_tokens": 20}} for sid in ids]
            assert commit_batch(sessions, run_id=run_id, batch_id=batch, attempt=attempt,
                                output_key=f"s3://b/o/{batch}", output_sha256="0" * 64, rows=rows)
            committed.append(batch)
            time.sleep(0.005)  # a worker's pace, not a spin: the 2 cores are the submit's too
    except BaseException as e:  # noqa: BLE001 - the test reports it
        errors.append(e)


def test_a_submit_appended_to_a_run_while_two_workers_commit_it_finishes_without_a_deadlock(
        settings, s3_env, s3_bucket, sessions, tmp_path, model_folder):
    env = cli_env(settings, s3_env)
    data = _write(tmp_path / "grow.jsonl", 0, FIRST_ROWS)
    args = ["submit", str(data), "--run", "grow", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/grow",
            "--batch-size", str(BATCH_SIZE), "--json"]
    run_cli(args, env)
    with sessions() as s:
        run_id = s.execute(text("SELECT id FROM runs WHERE name = 'grow'")).scalar_one()
    before = _deadlocks(sessions)

    stop, committed, errors = threading.Event(), [], []
    workers = [threading.Thread(target=_committer, args=(sessions, run_id, stop, committed, errors, f"w{i}"))
               for i in range(2)]
    for w in workers:
        w.start()
    try:
        _write(data, FIRST_ROWS, FIRST_ROWS + APPENDED_ROWS)
        appended = run_cli(args, env, check=False)
        during_submit = len(committed)
    finally:
        stop.set()
        for w in workers:
            w.join()
    sessions.kw["bind"].dispose()  # each backend's statistics are flushed at its exit at the latest

    assert appended.returncode == 0, appended.stderr[-3000:]
    assert json.loads(appended.stdout)["samples_new"] == APPENDED_ROWS
    assert not errors, errors
    assert during_submit >= 20, f"only {during_submit} commits beside the submit: the two did not overlap"
    time.sleep(1)  # a backend's exit flushes its statistics: give the closed ones that moment
    assert _deadlocks(sessions) - before == 0
    with sessions() as s:
        kept = dict(s.execute(text("SELECT status, sum(n) FROM run_sample_counts WHERE run_id = :r GROUP BY 1"),
                              {"r": run_id}).all())
        counted = dict(s.execute(text("SELECT status, count(*) FROM samples WHERE run_id = :r GROUP BY 1"),
                                 {"r": run_id}).all())
    assert {k: v for k, v in kept.items() if v} == counted
