"""run_sample_counts (migration 0005) stays equal to a count over the samples through every writer."""

from __future__ import annotations

import random

from sqlalchemy import text

from ledger import transitions


def _counted(s, run_id: int) -> dict[tuple[str, str], int]:
    return {(r[0], r[1]): int(r[2]) for r in s.execute(text(
        "SELECT status, coalesce(quality, ''), count(*) FROM samples WHERE run_id = :r GROUP BY 1, 2"), {"r": run_id})}


def _kept(s, run_id: int) -> dict[tuple[str, str], int]:
    return {(r[0], r[1]): int(r[2]) for r in s.execute(text(
        # Summed over the run's shards (migration 0011): a shard's own n may be below zero.
        "SELECT status, quality, sum(n) FROM run_sample_counts WHERE run_id = :r GROUP BY 1, 2 HAVING sum(n) <> 0"),
        {"r": run_id})}


def _new_run(s, name: str) -> int:
    return s.execute(text(
        "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
        "VALUES (:n, 'm', '{}', 'h', 's3://b/x', 'regen', 4, 'active') RETURNING id"), {"n": name}).scalar_one()


def test_counts_follow_copy_commit_retry_and_delete(sessions):
    with sessions.begin() as s:
        run, other = _new_run(s, "counted"), _new_run(s, "other")
        batches = transitions.insert_batches(s, run, [(1, "k1", 50), (2, "k2", 50)])
        (other_batch,) = transitions.insert_batches(s, other, [(1, "k", 3)])
        # The submit's COPY, two runs in one transaction.
        transitions.copy_pending_samples(s, run, ((f"s{i}", batches[i // 50], "f", i) for i in range(100)))
        transitions.copy_pending_samples(s, other, ((f"o{i}", other_batch, "f", i) for i in range(3)))
    with sessions() as s:
        assert _kept(s, run) == _counted(s, run) == {("pending", ""): 100}
        assert _kept(s, other) == {("pending", ""): 3}

    # A batch commit: one UPDATE per sample (executemany), done or failed, with a class.
    rng = random.Random(0)
    classes = ["ok", "ok", "ok", "stub_answer", "unoffered_tool"]
    params = []
    for i in range(50):
        failed = i % 10 == 0
        params.append({"status": "failed" if failed else "done", "finish": "stop", "stop": None, "turns": 1,
                       "pt": 1, "ct": 1, "rt": 0, "at": 1, "tc": 0, "key": "o", "run": run, "sid": f"s{i}",
                       "error": "x: y" if failed else None, "quality": "failed" if failed else rng.choice(classes)})
    with sessions.begin() as s:
        transitions.record_samples(s, params)
    with sessions() as s:
        assert _kept(s, run) == _counted(s, run)
        assert sum(n for (status, _), n in _kept(s, run).items() if status == "failed") == 5

    # retry --failed: failed -> pending, quality cleared, into a new batch.
    with sessions.begin() as s:
        (retry_batch,) = transitions.insert_batches(s, run, [(3, "k3", 5)])
        transitions.retry_samples(s, run, retry_batch, [f"s{i}" for i in range(0, 50, 10)])
    with sessions() as s:
        assert _kept(s, run) == _counted(s, run)
        assert _kept(s, run)[("pending", "")] == 55

    # A hand-written DELETE, then the run itself (samples go by cascade; the counts with it).
    with sessions.begin() as s:
        s.execute(text("DELETE FROM samples WHERE run_id = :r AND sample_id IN ('s1', 's2', 's99')"), {"r": run})
    with sessions() as s:
        assert _kept(s, run) == _counted(s, run)
    with sessions.begin() as s:
        s.execute(text("DELETE FROM runs WHERE id = :r"), {"r": run})
    with sessions() as s:
        assert s.execute(text("SELECT count(*) FROM run_sample_counts WHERE run_id = :r"), {"r": run}).scalar() == 0
        assert _kept(s, other) == _counted(s, other) == {("pending", ""): 3}
