"""``regen clean``: a run's prefix and (on request) its ledger rows go; nothing of another run does."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger.errors import ConfigError
from ledger.objects import ObjectStore
from producer.clean import clean_run, describe_plan, plan_clean


def _add_run(sessions, store: ObjectStore, name: str, output_url: str, *, batch_status: str = "done",
             objects: int = 3) -> None:
    with sessions.begin() as s:
        run_id = s.execute(text(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
            "VALUES (:n, 'm', '{}', 'h', :url, 'regen', 4, 'finished') RETURNING id"),
            {"n": name, "url": output_url}).scalar_one()
        batch_id = s.execute(text(
            "INSERT INTO batches (run_id, seq, status, input_key, n_samples) VALUES (:run, 1, :st, 'k', 2) "
            "RETURNING id"), {"run": run_id, "st": batch_status}).scalar_one()
        s.execute(text("INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row) "
                       "VALUES (:run, 'a', :b, 'f', 1), (:run, 'b', :b, 'f', 2)"), {"run": run_id, "b": batch_id})
        s.execute(text("INSERT INTO rejected_rows (run_id, source_file, source_row, reason, detail) "
                       "VALUES (:run, 'f', 3, 'malformed_json', 'x')"), {"run": run_id})
    store.put(f"{output_url}/run.json", b"{}")
    for i in range(1, objects):
        store.put(f"{output_url}/outputs/batch-{i:06d}.jsonl.zst", b"x" * i)


def _count(sessions, table: str, run: str) -> int:
    with sessions() as s:
        return s.scalar(text(f"SELECT count(*) FROM {table} t JOIN runs r ON r.id = t.run_id WHERE r.name = :n"),
                        {"n": run})


@pytest.fixture
def store(s3_env) -> ObjectStore:
    return ObjectStore(max_attempts=3)


def test_clean_deletes_the_runs_prefix_and_its_ledger_rows_but_not_a_neighbours(sessions, store, s3_bucket):
    _add_run(sessions, store, "a", f"{s3_bucket}/regen/a")
    _add_run(sessions, store, "ab", f"{s3_bucket}/regen/ab")   # shares the string prefix, not the folder
    plan = plan_clean(sessions, store, "a")
    assert (plan.objects, plan.batches, plan.samples, plan.rejected_rows, plan.busy_batches) == (3, 1, 2, 1, 0)
    assert "3 objects under" in describe_plan(plan, delete_ledger=True)

    report = clean_run(sessions, store, "a", delete_ledger=True)

    assert report.objects_deleted == 3 and report.ledger_deleted
    assert list(store.list(f"{s3_bucket}/regen/a")) == []
    assert len(list(store.list(f"{s3_bucket}/regen/ab"))) == 3
    with sessions() as s:
        assert s.scalar(text("SELECT count(*) FROM runs WHERE name = 'a'")) == 0
        assert s.scalar(text("SELECT count(*) FROM samples")) == 2            # only run ab's
        assert s.scalar(text("SELECT count(*) FROM batches")) == 1
        assert s.scalar(text("SELECT count(*) FROM rejected_rows")) == 1
    assert _count(sessions, "samples", "ab") == 2


def test_clean_without_ledger_keeps_the_rows_and_says_the_objects_are_gone(sessions, store, s3_bucket):
    _add_run(sessions, store, "a", f"{s3_bucket}/regen/a")
    report = clean_run(sessions, store, "a", delete_ledger=False)
    assert report.objects_deleted == 3 and not report.ledger_deleted
    assert _count(sessions, "samples", "a") == 2
    with sessions() as s:
        reason = s.scalar(text("SELECT status_reason FROM runs WHERE name = 'a'"))
    assert reason.startswith("objects deleted by regen clean") and "(3 objects)" in reason


def test_clean_refuses_a_prefix_that_holds_another_runs_output(sessions, store, s3_bucket):
    _add_run(sessions, store, "parent", f"{s3_bucket}/regen")
    _add_run(sessions, store, "child", f"{s3_bucket}/regen/child")
    for run in ("parent", "child"):
        plan = plan_clean(sessions, store, run)
        assert "refused: the prefix overlaps the output of" in describe_plan(plan, delete_ledger=False)
        with pytest.raises(ConfigError, match="overlaps the output of"):
            clean_run(sessions, store, run, delete_ledger=True)
    assert len(list(store.list(f"{s3_bucket}/regen"))) == 6
    assert _count(sessions, "samples", "parent") == 2


def test_clean_refuses_a_run_still_being_generated_unless_forced(sessions, store, s3_bucket):
    _add_run(sessions, store, "busy", f"{s3_bucket}/regen/busy", batch_status="running")
    with pytest.raises(ConfigError, match="1 batches waiting or running"):
        clean_run(sessions, store, "busy", delete_ledger=True)
    assert len(list(store.list(f"{s3_bucket}/regen/busy"))) == 3
    assert clean_run(sessions, store, "busy", delete_ledger=True, force=True).objects_deleted == 3


def test_another_runs_unparsable_url_does_not_block_a_clean(sessions, store, s3_bucket):
    _add_run(sessions, store, "a", f"{s3_bucket}/regen/a")
    with sessions.begin() as s:
        s.execute(text("INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size) "
                       "VALUES ('odd', 'm', '{}', 'h', 's3://x/old-style', 'regen', 4)"))
    assert clean_run(sessions, store, "a", delete_ledger=True).objects_deleted == 3


def test_clean_of_an_unknown_run_is_a_config_error(sessions, store):
    with pytest.raises(ConfigError, match="no run named 'nope'"):
        clean_run(sessions, store, "nope", delete_ledger=True)
