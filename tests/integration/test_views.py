"""The views of migration 0003 and every query of docs/sql.md, on a finished run built in the ledger.

The run is written row by row with fixed times, so every figure below is worked out
by hand in the comments. docs/sql.md is parsed and each ```sql block executed as a
user would paste it (psql's ``:'run'`` becomes a bound parameter), so the docs cannot
drift from the schema without this test failing.
"""

from __future__ import annotations

import io
import re
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import psycopg
import pytest
from sqlalchemy import text

from ledger import migrate
from ledger.db import make_engine
from ledger.errors import ConfigError
from ledger.settings import Settings
from producer.monitoring.status import run_status
from producer.monitoring.watch import watch_status
from tests.support.helpers import ROOT

SQL_DOC = ROOT / "docs" / "sql.md"
FORMATS_DOC = ROOT / "docs" / "formats.md"
T0 = datetime(2026, 1, 1, 10, 0, tzinfo=timezone.utc)
RUN = "views-run"


def _at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def build_ledger(sessions) -> dict[str, int]:
    """Run ``views-run`` (finished) and run ``live`` (one batch still running).

    views-run, 10 samples in 4 batches, active 10:00-11:00 (3600 s):
      seq 1  done  gpu0-1@n1  10:00-10:20 (1200 s)  s1 4000, s2 5000, s3 3000 tokens        = 12000
      seq 2  done  gpu2-3@n1  10:05-10:35 (1800 s)  s4 6000 (length), s5 3000, s6 failed   =  9000
      seq 3  done  gpu0-1@n1  10:26:40-11:00 (2000 s), 2nd attempt  s7 21000, s8 failed   = 21000
      seq 4  dead  (engine died, 3 failures)  s9, s10 pending
    Rejected rows: a.jsonl:5 and b.jsonl:7 malformed_json; b.jsonl:8 duplicate_id.
    """
    ids: dict[str, int] = {}
    with sessions.begin() as s:
        for name, status in ((RUN, "finished"), ("live", "active")):
            ids[name] = s.execute(text(
                "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
                "VALUES (:n, 'm', '{}', 'h', :url, 'regen', 4, :st) RETURNING id"),
                {"n": name, "url": f"s3://b/{name}", "st": status}).scalar_one()
        run = ids[RUN]
        batches = [
            # seq, status, worker, started (min), finished (min), attempts, failures, n, completion, error
            (1, "done", "gpu0-1@n1", 0, 20, 1, 0, 3, 12000, None),
            (2, "done", "gpu2-3@n1", 5, 35, 1, 0, 3, 9000, None),
            (3, "done", "gpu0-1@n1", 60 - 2000 / 60, 60, 2, 1, 2, 21000, None),
            (4, "dead", None, None, 50, 3, 3, 2, None, "engine died: CUDA error: an illegal memory access"),
        ]
        for seq, status, worker, started, finished, attempts, failures, n, completion, error in batches:
            ids[f"b{seq}"] = s.execute(text(
                "INSERT INTO batches (run_id, seq, status, attempts, failures, worker, enqueued_at, started_at, "
                "finished_at, heartbeat_at, input_key, output_key, n_samples, prompt_tokens, completion_tokens, "
                "error) VALUES (:run, :seq, :status, :attempts, :failures, :worker, :enq, :started, :finished, "
                ":finished, :ik, :ok, :n, :pt, :ct, :error) RETURNING id"),
                {"run": run, "seq": seq, "status": status, "attempts": attempts, "failures": failures,
                 "worker": worker, "enq": T0 - timedelta(minutes=5),
                 "started": None if started is None else _at(started), "finished": _at(finished),
                 "ik": f"s3://b/{RUN}/inputs/batch-{seq:06d}.jsonl.zst",
                 "ok": f"s3://b/{RUN}/outputs/batch-{seq:06d}.jsonl.zst" if status == "done" else None,
                 "n": n, "pt": 100 * n if status == "done" else None, "ct": completion, "error": error}
            ).scalar_one()
        samples = [
            # id, batch, file, row, status, finish, stop, completion, error, quality
            ("s1", 1, "a.jsonl", 1, "done", "stop", None, 4000, None, "ok"),
            ("s2", 1, "a.jsonl", 2, "done", "stop", None, 5000, None, "ok"),
            ("s3", 1, "b.jsonl", 1, "done", "stop", None, 3000, None, "ok"),
            ("s4", 2, "b.jsonl", 2, "done", "length", "truncated", 6000, None, "truncated_answer"),
            ("s5", 2, "b.jsonl", 3, "done", "stop", "max_turns", 3000, None, "ok"),
            ("s6", 2, "b.jsonl", 4, "failed", None, None, 0, "prompt_too_long: 9000 > 8192", "failed"),
            ("s7", 3, "a.jsonl", 3, "done", "stop", None, 21000, None, "stub_answer"),
            ("s8", 3, "a.jsonl", 4, "failed", None, None, 0, "template_error: UndefinedError: x", "failed"),
            ("s9", 4, "b.jsonl", 5, "pending", None, None, None, None, None),
            ("s10", 4, "b.jsonl", 6, "pending", None, None, None, None, None),
        ]
        for sid, seq, file, row, status, finish, stop, completion, error, quality in samples:
            done = status != "pending"
            s.execute(text(
                "INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status, finish_reason, "
                "stop_reason, turns, prompt_tokens, completion_tokens, reasoning_tokens, output_key, error, quality) "
                "VALUES (:run, :sid, :batch, :file, :row, :status, :finish, :stop, :turns, :pt, :ct, :rt, :ok, "
                ":error, :quality)"),
                {"run": run, "sid": sid, "batch": ids[f"b{seq}"], "file": file, "row": row, "status": status,
                 "finish": finish, "stop": stop, "turns": 1 if done else None, "pt": 100 if done else None,
                 "ct": completion, "rt": None if completion is None else completion // 2,
                 "ok": f"s3://b/{RUN}/outputs/batch-{seq:06d}.jsonl.zst" if done else None, "error": error,
                 "quality": quality})
        for file, row, reason in (("a.jsonl", 5, "malformed_json"), ("b.jsonl", 7, "malformed_json"),
                                  ("b.jsonl", 8, "duplicate_id")):
            s.execute(text("INSERT INTO rejected_rows (run_id, source_file, source_row, reason, detail) "
                           "VALUES (:run, :f, :r, :reason, 'x')"), {"run": run, "f": file, "r": row, "reason": reason})

        live = ids["live"]
        done_id = s.execute(text(
            "INSERT INTO batches (run_id, seq, status, attempts, worker, started_at, finished_at, input_key, "
            "n_samples, prompt_tokens, completion_tokens) VALUES (:run, 1, 'done', 1, 'cpu0@n2', :st, :fi, 'k1', 1, "
            "10, 600) RETURNING id"), {"run": live, "st": _at(0), "fi": _at(10)}).scalar_one()
        running_id = s.execute(text(
            "INSERT INTO batches (run_id, seq, status, attempts, failures, worker, started_at, heartbeat_at, "
            "input_key, n_samples) VALUES (:run, 2, 'running', 2, 1, 'gpu4@n2', now() - interval '600 seconds', "
            "now() - interval '30 seconds', 'k2', 2) RETURNING id"), {"run": live}).scalar_one()
        s.execute(text(
            "INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status, completion_tokens, "
            "finish_reason) VALUES (:run, 'l1', :b1, 'c.jsonl', 1, 'done', 600, 'stop'), "
            "(:run, 'l2', :b2, 'c.jsonl', 2, 'pending', NULL, NULL), (:run, 'l3', :b2, 'c.jsonl', 3, 'pending', NULL, NULL)"),
            {"run": live, "b1": done_id, "b2": running_id})
    return ids


@pytest.fixture
def ledger(sessions):
    build_ledger(sessions)
    return sessions


def _rows(sessions, sql: str, params: dict | None = None) -> list[dict]:
    with sessions() as s:
        return [dict(r) for r in s.execute(text(sql), params or {}).mappings()]


# -- the views -----------------------------------------------------------------------------------


def test_run_progress_counts_samples_batches_and_tokens_of_each_run(ledger):
    rows = {r["run"]: r for r in _rows(ledger, "SELECT * FROM run_progress")}
    p = rows[RUN]
    assert (p["samples"], p["done"], p["failed"], p["pending"], p["truncated"], p["bad_quality"]) == (10, 6, 2, 2, 1, 2)
    assert (p["rejected"], p["duplicates"]) == (2, 1)
    assert p["done_pct"] == Decimal("60.00") and p["settled_pct"] == Decimal("80.00")
    assert (p["batches"], p["batches_done"], p["batches_dead"], p["batches_running"], p["batches_waiting"]) == \
        (4, 3, 1, 0, 0)
    assert p["completion_tokens"] == 42000 and p["prompt_tokens"] == 800 and p["reasoning_tokens"] == 21000
    assert p["first_started_at"] == T0 and p["last_finished_at"] == _at(60)
    assert p["active_s"] == Decimal("3600.0")
    assert p["completion_tokens_per_s"] == Decimal("11.7")      # 42000 / 3600
    assert p["samples_per_s"] == Decimal("0.002")               # 6 / 3600
    live = rows["live"]
    assert (live["samples"], live["done"], live["pending"], live["batches_running"]) == (3, 1, 2, 1)
    assert live["rejected"] == 0 and live["done_pct"] == Decimal("33.33")


def test_run_progress_lists_a_run_without_samples_with_zeros(ledger):
    with ledger.begin() as s:
        s.execute(text("INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size) "
                       "VALUES ('empty', 'm', '{}', 'h', 's3://b/e', 'regen', 4)"))
    (row,) = _rows(ledger, "SELECT * FROM run_progress WHERE run = 'empty'")
    assert (row["samples"], row["done"], row["batches"], row["completion_tokens"]) == (0, 0, 0, 0)
    assert row["done_pct"] is None and row["completion_tokens_per_s"] is None


def test_worker_throughput_hourly_buckets_batches_by_commit_hour(ledger):
    rows = {(r["hour"], r["worker"]): r for r in _rows(ledger, "SELECT * FROM worker_throughput_hourly")}
    ten, eleven = T0, T0 + timedelta(hours=1)
    assert set(rows) == {(ten, "gpu0-1@n1"), (ten, "gpu2-3@n1"), (eleven, "gpu0-1@n1"), (ten, "cpu0@n2")}
    first = rows[(ten, "gpu0-1@n1")]
    assert (first["batches"], first["samples"], first["completion_tokens"], first["gpus"]) == (1, 3, 12000, 2)
    assert first["completion_tokens_per_s"] == Decimal("3.3") and first["avg_batch_s"] == Decimal("1200.0")
    assert rows[(ten, "gpu2-3@n1")]["completion_tokens_per_s"] == Decimal("2.5")
    assert rows[(eleven, "gpu0-1@n1")]["completion_tokens"] == 21000
    assert rows[(eleven, "gpu0-1@n1")]["avg_batch_s"] == Decimal("2000.0")
    assert rows[(ten, "cpu0@n2")]["gpus"] is None and rows[(ten, "cpu0@n2")]["runs"] == "live"


def test_failures_by_reason_groups_failed_samples_dead_batches_and_rejected_rows(ledger):
    rows = _rows(ledger, "SELECT kind, reason, n, example FROM failures_by_reason WHERE run = :r ORDER BY kind, reason",
                 {"r": RUN})
    assert [(r["kind"], r["reason"], r["n"], r["example"]) for r in rows] == [
        ("batch_dead", "engine died", 1, "batch 4"),
        ("duplicate", "duplicate_id", 1, "b.jsonl:8"),
        ("rejected", "malformed_json", 2, "a.jsonl:5"),
        ("sample_failed", "prompt_too_long", 1, "s6"),
        ("sample_failed", "template_error", 1, "s8"),
    ]
    assert _rows(ledger, "SELECT * FROM failures_by_reason WHERE run = 'live'") == []


def test_batch_durations_and_running_batches(ledger):
    durations = {r["seq"]: r for r in _rows(ledger, "SELECT * FROM batch_durations WHERE run = :r", {"r": RUN})}
    assert set(durations) == {1, 2, 3}  # the dead batch never committed
    assert durations[3]["duration_s"] == Decimal("2000.0") and durations[3]["completion_tokens_per_s"] == \
        Decimal("10.5")
    assert durations[2]["gpus"] == 2 and durations[3]["attempts"] == 2
    (running,) = _rows(ledger, "SELECT * FROM running_batches")
    assert (running["run"], running["seq"], running["worker"], running["attempt"]) == ("live", 2, "gpu4@n2", 2)
    assert 25 <= running["heartbeat_age_s"] <= 120 and 595 <= running["running_s"] <= 700


def test_quality_by_run_gives_each_class_and_its_share_of_classified_samples(ledger):
    rows = {r["quality"]: (r["n"], r["pct"]) for r in
            _rows(ledger, "SELECT * FROM quality_by_run WHERE run = :r", {"r": RUN})}
    # 8 classified samples (6 done, 2 failed); the 2 pending ones have no class yet.
    assert rows == {"ok": (4, Decimal("50.00")), "failed": (2, Decimal("25.00")),
                    "truncated_answer": (1, Decimal("12.50")), "stub_answer": (1, Decimal("12.50"))}


def test_worker_gpus_function(ledger):
    (row,) = _rows(ledger, "SELECT worker_gpus('gpu0-1@h') a, worker_gpus('gpu7@h') b, worker_gpus('gpu0-1-2-3@h') c, "
                           "worker_gpus('cpu0@h') d, worker_gpus('mybox') e, worker_gpus(NULL) f")
    assert row == {"a": 2, "b": 1, "c": 4, "d": None, "e": None, "f": None}


def test_views_go_with_a_downgrade_and_come_back_with_an_upgrade(pg_server):
    name = f"regen_views_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            settings = Settings(database_url=pg_server.dsn(name))
            migrate.upgrade(settings)
            assert EXPECTED_VIEWS <= _views(settings)
            migrate.downgrade(settings, "0002")
            assert not EXPECTED_VIEWS & _views(settings)
            migrate.upgrade(settings)
            assert EXPECTED_VIEWS <= _views(settings)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


EXPECTED_VIEWS = {"run_progress", "worker_throughput_hourly", "failures_by_reason", "batch_durations",
                  "running_batches", "quality_by_run"}


def _views(settings: Settings) -> set[str]:
    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return set(conn.scalars(text("SELECT viewname FROM pg_views WHERE schemaname = 'public'")))
    finally:
        engine.dispose()


# -- regen status --watch on the same ledger -------------------------------------------------------


def test_status_reports_samples_in_flight_and_heartbeat_ages(ledger):
    with ledger() as s:
        live = run_status(s, "live")[0]
    assert live["samples_in_flight"] == 2
    (worker,) = live["workers"]
    assert worker["worker"] == "gpu4@n2" and worker["samples"] == 2 and 25 <= worker["heartbeat_age_s"] <= 120


def _documented_status() -> dict:
    import json

    block = re.search(r"## `regen status --json`\n```json\n(.*?)```", FORMATS_DOC.read_text(), flags=re.S)
    assert block, "docs/formats.md documents `regen status --json` in a ```json block"
    return json.loads(block.group(1))["runs"][0]


#: Keys named by the data (reasons, classes), not by the code: compared as {str: int}, not key by key.
OPEN_KEYS = {"rejected_reasons", "failed_reasons", "quality"}


def test_status_json_has_exactly_the_documented_keys(ledger):
    with ledger() as s:
        live = run_status(s, "live")[0]
    doc = _documented_status()
    assert set(live) == set(doc), f"docs/formats.md drifted: code {sorted(set(live) ^ set(doc))}"
    for key, example in doc.items():
        if key in OPEN_KEYS:
            assert isinstance(live[key], dict) and all(isinstance(v, int) for v in live[key].values()), key
        elif isinstance(example, dict):
            assert set(live[key]) == set(example), f"{key}: code {sorted(live[key])}, docs {sorted(example)}"
        elif isinstance(example, list) and example and live[key]:
            assert set(live[key][0]) == set(example[0]), f"{key}[0]: code {sorted(live[key][0])}"
    assert set(live["samples"]) == {"pending", "done", "failed", "rejected", "duplicates"}


def test_watch_renders_the_ledgers_runs(settings, ledger):
    out = io.StringIO()
    assert watch_status(settings, interval_s=1, out=out, iterations=1) == 0
    frame = out.getvalue()
    assert "views-run  [finished]" in frame and " 60.0% done" in frame and "nothing left to generate" not in frame
    assert "live  [active]" in frame and "1 done · 0 failed · 2 in flight · 0 waiting · of 3" in frame
    assert "gpu4@n2: 1 running, heartbeat" in frame
    with pytest.raises(ConfigError, match="no run named 'nope'"):
        watch_status(settings, "nope", out=io.StringIO(), iterations=1)


# -- docs/sql.md ---------------------------------------------------------------------------------


def documented_queries() -> dict[str, str]:
    blocks = re.findall(r"```sql\n(.*?)```", SQL_DOC.read_text(), flags=re.S)
    queries = {}
    for block in blocks:
        match = re.match(r"-- name: (\w+)\n", block)
        assert match, f"every ```sql block in docs/sql.md starts with '-- name: ...':\n{block}"
        queries[match.group(1)] = block
    return queries


def run_documented(sessions, sql: str, **variables: str) -> list[dict]:
    # psql's :'name' (a quoted variable) becomes a bound parameter.
    return _rows(sessions, re.sub(r":'(\w+)'", r":\1", sql), variables)


def _check_progress(rows):
    by_run = {r["run"]: r for r in rows}
    assert list(by_run) == [RUN, "live"]
    assert (by_run[RUN]["done"], by_run[RUN]["done_pct"], by_run[RUN]["batches_dead"]) == (6, Decimal("60.00"), 1)
    assert by_run[RUN]["completion_tokens_per_s"] == Decimal("11.7")


def _check_truncated(rows):
    assert [(r["sample_id"], r["source_file"], r["source_row"], r["completion_tokens"]) for r in rows] == \
        [("s4", "b.jsonl", 2, 6000)]


def _check_stop_reasons(rows):
    assert [(r["stop_code"], r["samples"]) for r in rows] == [("(completed)", 4), ("max_turns", 1), ("truncated", 1)]


def _check_tokens_per_gpu_hour(rows):
    got = {r["worker"]: (r["gpus"], r["batches"], r["completion_tokens"], r["hours"], r["tokens_per_gpu_hour"])
           for r in rows}
    # gpu0-1: 33000 tokens over 10:00-11:00 on 2 GPUs; gpu2-3: 9000 over half an hour on 2 GPUs.
    assert got == {"gpu0-1@n1": (2, 2, 33000, Decimal("1.00"), Decimal("16500.0")),
                   "gpu2-3@n1": (2, 1, 9000, Decimal("0.50"), Decimal("9000.0"))}
    assert [r["worker"] for r in rows] == ["gpu0-1@n1", "gpu2-3@n1"]
    assert rows[1]["tokens_per_hour"] == Decimal("18000.0")


def _check_worker_hourly(rows):
    assert [(r["hour"], r["worker"], r["completion_tokens"]) for r in rows] == [
        (T0, "gpu0-1@n1", 12000), (T0, "gpu2-3@n1", 9000), (T0 + timedelta(hours=1), "gpu0-1@n1", 21000)]


def _check_error_rate(rows):
    got = {r["source_file"]: (r["samples"], r["failed"], r["pending"], r["rejected"], r["duplicates"], r["error_pct"])
           for r in rows}
    # a.jsonl: 4 samples, 1 failed, 1 rejected -> 2/5; b.jsonl: 6 samples, 1 failed, 1 rejected -> 2/7.
    assert got == {"a.jsonl": (4, 1, 0, 1, 0, Decimal("40.00")), "b.jsonl": (6, 1, 2, 1, 1, Decimal("28.57"))}
    assert rows[0]["source_file"] == "a.jsonl"


def _check_failures(rows):
    assert [(r["kind"], r["reason"], r["n"]) for r in rows] == [
        ("batch_dead", "engine died", 1), ("duplicate", "duplicate_id", 1), ("rejected", "malformed_json", 2),
        ("sample_failed", "prompt_too_long", 1), ("sample_failed", "template_error", 1)]


def _check_failed_sample_errors(rows):
    assert [(r["sample_id"], r["error"]) for r in rows] == [
        ("s8", "template_error: UndefinedError: x"), ("s6", "prompt_too_long: 9000 > 8192")]


def _check_dead_batches(rows):
    assert [(r["seq"], r["failures"]) for r in rows] == [(4, 3)]
    assert rows[0]["error"].startswith("engine died")


def _check_slowest(rows):
    assert [(r["seq"], r["worker"], r["duration_s"]) for r in rows] == [
        (3, "gpu0-1@n1", Decimal("2000.0")), (2, "gpu2-3@n1", Decimal("1800.0")), (1, "gpu0-1@n1", Decimal("1200.0"))]


def _check_retried(rows):
    assert [(r["seq"], r["status"], r["attempts"], r["failures"]) for r in rows] == [(4, "dead", 3, 3),
                                                                                   (3, "done", 2, 1)]


def _check_running(rows):
    assert [(r["worker"], r["run"], r["seq"], r["attempt"]) for r in rows] == [("gpu4@n2", "live", 2, 2)]
    assert 25 <= rows[0]["heartbeat_age_s"] <= 120


def _check_running_by_worker(rows):
    assert [(r["worker"], r["batches"]) for r in rows] == [("gpu4@n2", 1)]
    assert 25 <= rows[0]["max_heartbeat_age_s"] <= 120


def _check_quality(rows):
    assert [(r["quality"], r["n"], r["pct"]) for r in rows] == [
        ("ok", 4, Decimal("50.00")), ("failed", 2, Decimal("25.00")), ("stub_answer", 1, Decimal("12.50")),
        ("truncated_answer", 1, Decimal("12.50"))]


def _check_where_is_sample(rows):
    assert [(r["sample_id"], r["status"], r["source_file"], r["source_row"], r["seq"]) for r in rows] == \
        [("s7", "done", "a.jsonl", 3, 3)]
    assert rows[0]["output_key"] == f"s3://b/{RUN}/outputs/batch-000003.jsonl.zst"


CHECKS = {
    "progress": _check_progress,
    "truncated_samples": _check_truncated,
    "stop_reasons": _check_stop_reasons,
    "tokens_per_gpu_hour": _check_tokens_per_gpu_hour,
    "worker_hourly": _check_worker_hourly,
    "error_rate_by_source_file": _check_error_rate,
    "failures_by_reason": _check_failures,
    "failed_sample_errors": _check_failed_sample_errors,
    "dead_batches": _check_dead_batches,
    "slowest_batches": _check_slowest,
    "retried_batches": _check_retried,
    "running_batches": _check_running,
    "running_by_worker": _check_running_by_worker,
    "quality": _check_quality,
    "where_is_sample": _check_where_is_sample,
}


def test_every_documented_query_is_checked_here():
    assert set(documented_queries()) == set(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_documented_query_answers_on_the_finished_run(ledger, name):
    sql = documented_queries()[name]
    CHECKS[name](run_documented(ledger, sql, run=RUN, sample="s7"))
