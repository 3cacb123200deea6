"""The finish check of migration 0011: an EXISTS after the commit, with no row that every commit writes."""

from __future__ import annotations

import threading
import time

from sqlalchemy import text

from ledger import transitions


def _new_run(s, name: str) -> int:
    return s.execute(text(
        "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
        "VALUES (:n, 'm', '{}', 'h', 's3://b/x', 'regen', 4, 'active') RETURNING id"), {"n": name}).scalar_one()


def _status(sessions, run_id: int) -> str:
    with sessions() as s:
        return s.execute(text("SELECT status FROM runs WHERE id = :r"), {"r": run_id}).scalar_one()


def _claimed(sessions, run_id: int, n: int) -> list[tuple[int, int]]:
    with sessions.begin() as s:
        ids = transitions.insert_batches(s, run_id, [(i, f"k{i}", 4) for i in range(1, n + 1)])
        return [(b, transitions.claim(s, b, worker="w", lease_s=60)) for b in ids]


def _mark_done(s, batch: int, attempt: int) -> None:
    assert transitions.mark_done(s, batch, attempt, output_key="o", output_sha256="0" * 64, prompt_tokens=1,
                                 completion_tokens=1)


def test_of_two_commits_closing_the_last_two_batches_at_once_the_later_check_finishes_the_run(sessions):
    with sessions.begin() as s:
        run = _new_run(s, "two-last")
    (b1, a1), (b2, a2) = _claimed(sessions, run, 2)
    # Both commits in flight at once: neither sees the other's batch done before its own COMMIT.
    first, second = sessions(), sessions()
    try:
        _mark_done(first, b1, a1)
        _mark_done(second, b2, a2)
        first.commit()
        with sessions.begin() as s:
            assert not transitions.finish_run_if_drained(s, run)  # the second batch is still running
        second.commit()
        with sessions.begin() as s:
            assert transitions.finish_run_if_drained(s, run)
    finally:
        first.close()
        second.close()
    assert _status(sessions, run) == "finished"


def test_a_finish_check_beside_a_retry_reopening_batches_leaves_the_run_active(sessions):
    with sessions.begin() as s:
        run = _new_run(s, "revived")
    (b1, a1), (b2, a2) = _claimed(sessions, run, 2)
    with sessions.begin() as s:
        _mark_done(s, b1, a1)
        assert transitions.fail(s, b2, a2, error="boom", max_attempts=1).value == "dead"
    # `regen retry --dead`, uncommitted: the dead batch queued again, then the run's row locked to its COMMIT.
    # (A submit group's new batches lock the row too: their foreign key's KEY SHARE, which the check waits for.)
    retry = sessions()
    finished: list[bool] = []

    def check() -> None:
        with sessions.begin() as s:
            finished.append(transitions.finish_run_if_drained(s, run))
    checker = threading.Thread(target=check)
    try:
        assert len(transitions.revive_dead(retry, run)) == 1
        transitions.reactivate_run(retry, run)
        checker.start()
        time.sleep(0.5)  # the check finds nothing open in its snapshot, and waits for the retry's lock
        waited = checker.is_alive()
        retry.commit()
    finally:
        retry.close()  # never left holding its locks: the next test's TRUNCATE would wait on them
    checker.join(10)
    assert waited, "the finish check did not wait for the retry's lock"
    assert finished == [False]
    assert _status(sessions, run) == "active"


def test_a_run_whose_last_open_batch_died_is_finished_by_the_reconciler_pass(sessions, settings):
    from ledger.dispatch import make_celery
    from ledger.reconcile import reconcile_once

    with sessions.begin() as s:
        run = _new_run(s, "died")
    (b1, a1), (b2, a2) = _claimed(sessions, run, 2)
    with sessions.begin() as s:
        _mark_done(s, b1, a1)
        assert transitions.fail(s, b2, a2, error="boom", max_attempts=1).value == "dead"
    assert _status(sessions, run) == "active"  # no commit ran the check after the death
    reconcile_once(sessions, make_celery(settings), lease_s=30, max_attempts=3)
    assert _status(sessions, run) == "finished"
