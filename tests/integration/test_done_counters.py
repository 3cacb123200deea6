"""The run's batch counters (migrations 0009, 0011) stay equal to a count over the batches through every writer."""

from __future__ import annotations

from sqlalchemy import text

from ledger import transitions

_COUNTED = """
SELECT count(*) FILTER (WHERE status IN ('planned', 'queued', 'running')),
       count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'dead'),
       coalesce(sum(n_samples) FILTER (WHERE status = 'done'), 0),
       coalesce(sum(prompt_tokens) FILTER (WHERE status = 'done'), 0),
       coalesce(sum(completion_tokens) FILTER (WHERE status = 'done'), 0)
FROM batches WHERE run_id = :r"""
# Sharded by batch (run_batch_counts, migration 0011): the run's figures are the sums over its shards.
_KEPT = ("SELECT coalesce(sum(open_batches), 0), coalesce(sum(done_batches), 0), coalesce(sum(dead_batches), 0), "
         "coalesce(sum(done_samples), 0), coalesce(sum(done_prompt_tokens), 0), "
         "coalesce(sum(done_completion_tokens), 0) FROM run_batch_counts WHERE run_id = :r")


def _both(s, run_id: int) -> tuple[tuple, tuple]:
    return (tuple(int(v) for v in s.execute(text(_KEPT), {"r": run_id}).one()),
            tuple(s.execute(text(_COUNTED), {"r": run_id}).one()))


def _new_run(s, name: str) -> int:
    return s.execute(text(
        "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
        "VALUES (:n, 'm', '{}', 'h', 's3://b/x', 'regen', 4, 'active') RETURNING id"), {"n": name}).scalar_one()


def _done(s, batch_id: int, pt: int, ct: int) -> None:
    attempt = transitions.claim(s, batch_id, worker="w", lease_s=60)
    assert transitions.mark_done(s, batch_id, attempt, output_key="o", output_sha256="0" * 64, prompt_tokens=pt,
                                 completion_tokens=ct)


def test_counters_follow_submit_commit_death_revival_and_delete(sessions):
    with sessions.begin() as s:
        run, other = _new_run(s, "counted"), _new_run(s, "other")
        batches = transitions.insert_batches(s, run, [(i, f"k{i}", 4 + i) for i in range(1, 7)])
        (other_batch,) = transitions.insert_batches(s, other, [(1, "k", 3)])
        transitions.mark_published(s, batches[:4])
    with sessions() as s:
        kept, counted = _both(s, run)
        assert kept == counted == (6, 0, 0, 0, 0, 0)

    with sessions.begin() as s:
        _done(s, batches[0], 100, 1000)
        _done(s, batches[1], 200, 2000)
        _done(s, other_batch, 7, 70)
        # A batch that fails its last attempt is dead; revived, it is open again.
        attempt = transitions.claim(s, batches[2], worker="w", lease_s=60)
        assert transitions.fail(s, batches[2], attempt, error="boom", max_attempts=1).value == "dead"
        attempt = transitions.claim(s, batches[3], worker="w", lease_s=60)
        assert transitions.fail(s, batches[3], attempt, error="boom", max_attempts=1).value == "dead"
    with sessions() as s:
        kept, counted = _both(s, run)
        assert kept == counted == (2, 2, 2, 5 + 6, 300, 3000)
        assert _both(s, other)[0] == (0, 1, 0, 3, 7, 70)

    with sessions.begin() as s:
        assert len(transitions.revive_dead(s, run)) == 2
        _done(s, batches[2], 1, 10)
        # `regen clean --ledger` deletes batches (here one done, one planned) with a statement of its own.
        s.execute(text("DELETE FROM batches WHERE id = ANY(:ids)"), {"ids": [batches[0], batches[5]]})
    with sessions() as s:
        kept, counted = _both(s, run)
        assert kept == counted == (2, 2, 0, 6 + 7, 201, 2010)
