"""``regen metrics`` on a ledger with a history: a scrape reads the open batches, not the done ones, and its
figures still equal a full recount of the ledger's rows after every kind of write (issue 58, item 7)."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert as pg_insert

from bench.metrics_scale import LedgerShape, fill_ledger
from bench.plan_reads import caught_statements, plans_of
from ledger import delivery_counts, migrate, transitions
from ledger.db import make_engine
from ledger.models import RejectedRow
from ledger.settings import Settings
from ledger.states import REFUSED_PREFIX, BatchStatus, SampleStatus, refused_reason
from producer.monitoring.metrics import collect
from tests.integration.test_metrics import values

#: 20,000 done batches (1 in 50 failed once on its way), a few open, dead, refused and fake-refused ones,
#: 5,000 rejected rows: what the scrape may read is the open, failed and fake batches, not the rest.
HISTORY = LedgerShape(done=20_000, dead=2, running=3, queued=4, planned=5, refused=2, fake_refused=1,
                      rejected=5_000)
#: Ledger metrics a recount can check (the heartbeat's age moves with the clock; the rest is Redis or timing).
RECOUNTED = {"regen_run_info", "regen_batches", "regen_samples", "regen_samples_quality", "regen_rejected_rows",
             "regen_samples_done_total", "regen_completion_tokens_total", "regen_prompt_tokens_total",
             "regen_batches_done_total", "regen_batch_failures_total", "regen_last_commit_timestamp_seconds",
             "regen_running_batches", "regen_fake_batches", "regen_fake_refusals_total", "regen_refused_batches"}


def _scrape_reads(settings) -> dict[str, float]:
    """Rows each table gave up to one scrape's statements (EXPLAIN ANALYZE of each), and the scans they used."""
    engine = make_engine(settings)
    try:
        with caught_statements(engine) as caught:
            scrape = values(collect(settings, db=engine))
        assert scrape[("regen_ledger_up", frozenset())] == 1
    finally:
        engine.dispose()
    with psycopg.connect(settings.libpq_url) as conn:
        plans, rows = plans_of(conn, caught)
    return {**rows, "scans": [scan for reads in plans for scan in reads.scans]}


def test_a_scrape_reads_the_open_failed_and_fake_batches_not_the_done_history(settings, sessions):
    with sessions.begin() as s:
        fill_ledger(s, HISTORY)
    with psycopg.connect(settings.libpq_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE batches, rejected_rows")  # the statistics autovacuum keeps on a live ledger
    reads = _scrape_reads(settings)

    failed = HISTORY.done // 50 + HISTORY.dead
    # Queued and running (by status), ever failed (partial index), fake-refused (partial index), and one
    # index entry per run for its last commit.
    bound = HISTORY.queued + HISTORY.running + failed + HISTORY.fake_refused + 1
    assert not [s for s in reads["scans"] if s in ("Seq Scan batches", "Seq Scan rejected_rows")], reads["scans"]
    assert reads.get("batches", 0) <= bound, (reads, bound)
    assert reads.get("rejected_rows", 0) == 0, reads


def test_a_status_reads_the_rejected_rows_counts_not_the_rows(settings, sessions):
    from producer.monitoring.status import run_status, status_statements

    with sessions.begin() as s:
        fill_ledger(s, HISTORY)
        run_id, run_name = s.execute(text("SELECT id, name FROM runs ORDER BY id LIMIT 1")).one()
        by_reason = dict(s.execute(text("SELECT reason, count(*) FROM rejected_rows WHERE run_id = :r "
                                        "GROUP BY reason"), {"r": run_id}).all())
    with psycopg.connect(settings.libpq_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE rejected_rows")
        _plans, rows = plans_of(conn, [(sql, params) for _name, sql, params in status_statements(run_id)])
        [status] = run_status(conn, run_name)
    assert rows.get("rejected_rows", 0.0) == 0
    assert sum(by_reason.values()) == HISTORY.rejected
    assert status["rejected_reasons"] == {k: v for k, v in sorted(by_reason.items()) if k != "duplicate_id"}


# -- the figures against a recount of the rows -----------------------------------------------------------


def _recount(s) -> dict[tuple[str, frozenset], float]:
    """Every recounted metric from the rows themselves: the scans the exporter made before migration 0015."""
    out: dict[tuple[str, frozenset], float] = {}

    def put(name: str, value: float, **labels: str) -> None:
        out[(name, frozenset(labels.items()))] = float(value)

    names = {}
    for r in s.execute(text("SELECT id, name, model, queue, status FROM runs")).mappings():
        names[r["id"]] = run = r["name"]
        put("regen_run_info", 1, run=run, model=r["model"], queue=r["queue"], status=r["status"])
        for status in BatchStatus:
            put("regen_batches", 0, run=run, status=status.value)
        for status in SampleStatus:
            put("regen_samples", 0, run=run, status=status.value)
        for name in ("regen_completion_tokens_total", "regen_prompt_tokens_total", "regen_samples_done_total",
                     "regen_batches_done_total", "regen_batch_failures_total", "regen_fake_batches",
                     "regen_fake_refusals_total", "regen_refused_batches"):
            put(name, 0, run=run)
    for r in s.execute(text(
            "SELECT run_id, status, count(*) AS n, coalesce(sum(completion_tokens), 0) AS ct, "
            "coalesce(sum(prompt_tokens), 0) AS pt, count(*) FILTER (WHERE fake) AS fake, "
            "count(*) FILTER (WHERE starts_with(error, :refused)) AS refused, max(finished_at) AS last "
            "FROM batches GROUP BY 1, 2"), {"refused": REFUSED_PREFIX}).mappings():
        run = names[r["run_id"]]
        put("regen_batches", r["n"], run=run, status=r["status"])
        if r["status"] == "done":
            put("regen_completion_tokens_total", r["ct"], run=run)
            put("regen_prompt_tokens_total", r["pt"], run=run)
            put("regen_batches_done_total", r["n"], run=run)
            put("regen_fake_batches", r["fake"], run=run)
            put("regen_last_commit_timestamp_seconds", r["last"].timestamp(), run=run)
        if r["status"] == "queued":
            put("regen_refused_batches", r["refused"], run=run)
    for run_id, failures, refusals in s.execute(text(
            "SELECT run_id, sum(failures), sum(fake_refusals) FROM batches GROUP BY 1")):
        put("regen_batch_failures_total", failures, run=names[run_id])
        put("regen_fake_refusals_total", refusals, run=names[run_id])
    for run_id, status, n in s.execute(text("SELECT run_id, status, count(*) FROM samples GROUP BY 1, 2")):
        put("regen_samples", n, run=names[run_id], status=status)
        if status == "done":
            put("regen_samples_done_total", n, run=names[run_id])
    for run_id, quality, n in s.execute(text(
            "SELECT run_id, quality, count(*) FROM samples WHERE quality IS NOT NULL GROUP BY 1, 2")):
        put("regen_samples_quality", n, run=names[run_id], quality=quality)
    for run_id, reason, n in s.execute(text("SELECT run_id, reason, count(*) FROM rejected_rows GROUP BY 1, 2")):
        put("regen_rejected_rows", n, run=names[run_id], reason=reason)
    for run_id, worker, n in s.execute(text(
            "SELECT run_id, worker, count(*) FROM batches WHERE status = 'running' GROUP BY 1, 2")):
        put("regen_running_batches", n, run=names[run_id], worker=worker)
    return out


def _assert_scrape_equals_recount(settings, sessions) -> None:
    scrape = {k: v for k, v in values(collect(settings)).items() if k[0] in RECOUNTED}
    with sessions() as s:
        recount = _recount(s)
    assert scrape == pytest.approx(recount), {k: (scrape.get(k), recount.get(k))
                                              for k in scrape.keys() | recount.keys() if scrape.get(k) != recount.get(k)}


def _new_run(s, name: str) -> int:
    return s.execute(text(
        "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
        "VALUES (:n, 'm', '{}', 'h', 's3://b/x', 'regen', 4, 'active') RETURNING id"), {"n": name}).scalar_one()


def _reject(s, run_id: int, rows: list[tuple[str, int, str]]) -> None:
    """Rejected rows as submit writes them: a resubmit's rows already recorded are skipped."""
    s.execute(pg_insert(RejectedRow).values([
        {"run_id": run_id, "source_file": f, "source_row": row, "reason": reason, "detail": "x"}
        for f, row, reason in rows]).on_conflict_do_nothing(constraint="rejected_rows_source_key"))


def _commit(s, run_id: int, batch_id: int, sample_ids: list[str], *, fake: bool = False) -> None:
    """A worker's commit: claim, the samples (the last one failed), then the batch done."""
    attempt = transitions.claim(s, batch_id, worker="gpu0@n1", lease_s=60, fake=fake)
    params = [{"run": run_id, "sid": sid, "status": "failed" if i == len(sample_ids) - 1 else "done",
               "finish": "stop", "stop": None, "turns": 1, "pt": 10, "ct": 100 + i, "rt": None, "at": None,
               "tc": None, "key": "o", "error": None, "quality": "failed" if i == len(sample_ids) - 1 else "ok"}
              for i, sid in enumerate(sample_ids)]
    transitions.record_samples(s, params, batch_id=batch_id)
    assert transitions.mark_done(s, batch_id, attempt, output_key="o", output_sha256="0" * 64,
                                 prompt_tokens=10 * len(sample_ids), completion_tokens=1000, fake=fake)


def test_scrape_figures_equal_a_full_recount_through_commits_failures_retries_refusals_and_rejects(
        settings, sessions):
    samples = {seq: [f"s{seq}-{i}" for i in range(3)] for seq in range(1, 8)}
    with sessions.begin() as s:
        run = _new_run(s, "counted")
        s.execute(text("UPDATE runs SET benchmark = true WHERE id = :r"), {"r": run})
        batches = dict(zip(samples, transitions.insert_batches(s, run, [(seq, f"k{seq}", 3) for seq in samples]),
                           strict=True))
        transitions.copy_pending_samples(s, run, ((sid, batches[seq], "a.jsonl", i) for seq, ids in samples.items()
                                                  for i, sid in enumerate(ids)))
        _reject(s, run, [("a.jsonl", 100, "malformed_json"), ("a.jsonl", 101, "duplicate_id"),
                         ("b.jsonl", 1, "malformed_json")])
        transitions.mark_published(s, list(batches.values())[:6])
    _assert_scrape_equals_recount(settings, sessions)

    with sessions.begin() as s:
        _commit(s, run, batches[1], samples[1])
        _commit(s, run, batches[2], samples[2], fake=True)
        # A failed attempt (queued again), a batch dead at its last attempt, one running, one refused.
        attempt = transitions.claim(s, batches[3], worker="gpu1@n1", lease_s=60)
        assert transitions.fail(s, batches[3], attempt, error="boom", max_attempts=3) == BatchStatus.QUEUED
        attempt = transitions.claim(s, batches[4], worker="gpu1@n1", lease_s=60)
        assert transitions.fail(s, batches[4], attempt, error="boom", max_attempts=1) == BatchStatus.DEAD
        transitions.claim(s, batches[5], worker="gpu2@n2", lease_s=60)
        attempt = transitions.claim(s, batches[6], worker="gpu3@n2", lease_s=60)
        transitions.release(s, batches[6], attempt, reason=refused_reason("gpu3@n2", "model other, not m"))
        delivery_counts.count_fake_refusal(s, batches[3])
        # A resubmit: its rows already recorded are skipped, a new one is counted.
        _reject(s, run, [("a.jsonl", 100, "malformed_json"), ("c.jsonl", 5, "too_large")])
    _assert_scrape_equals_recount(settings, sessions)

    with sessions.begin() as s:
        # `regen retry --dead`: the dead batch queued again, its failures reset.
        assert len(transitions.revive_dead(s, run)) == 1
        attempt = transitions.claim(s, batches[3], worker="gpu1@n1", lease_s=60)
        assert transitions.fail(s, batches[3], attempt, error="boom again", max_attempts=3) == BatchStatus.QUEUED
        _commit(s, run, batches[3], samples[3])
        _commit(s, run, batches[6], samples[6])
        # Rows removed or corrected by hand with psql.
        s.execute(text("DELETE FROM rejected_rows WHERE source_file = 'b.jsonl'"))
        s.execute(text("UPDATE rejected_rows SET reason = 'missing_field' WHERE source_row = 101"))
        gone = _new_run(s, "cleaned")
        (gone_batch,) = transitions.insert_batches(s, gone, [(1, "k", 1)])
        _reject(s, gone, [("x.jsonl", 1, "malformed_json")])
        attempt = transitions.claim(s, gone_batch, worker="gpu0@n1", lease_s=60)
        transitions.fail(s, gone_batch, attempt, error="boom", max_attempts=3)
    _assert_scrape_equals_recount(settings, sessions)

    with sessions.begin() as s:
        # `regen clean --ledger`: the run's rows go by cascade, and its counts with them.
        s.execute(text("DELETE FROM runs WHERE id = :r"), {"r": gone})
        left = s.execute(text("SELECT count(*) FROM run_rejected_counts WHERE run_id = :r"), {"r": gone}).scalar()
        assert left == 0
    _assert_scrape_equals_recount(settings, sessions)


# -- the migration on a ledger with rows ------------------------------------------------------------------


@pytest.fixture
def scratch_ledger(pg_server):
    with pg_server.bare_database("regen_0015") as dsn:
        yield Settings(database_url=dsn)


def _failures_index(settings: Settings) -> tuple[bool, str] | None:
    with psycopg.connect(settings.libpq_url) as conn:
        return conn.execute("SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
                            "WHERE i.indexrelid = to_regclass('batches_failures_idx')").fetchone()


def test_migration_0015_counts_the_rejected_rows_already_there_and_rebuilds_an_interrupted_index(scratch_ledger):
    migrate.upgrade(scratch_ledger, "0014")
    engine = make_engine(scratch_ledger)
    try:
        with engine.begin() as s:
            fill_ledger(s, LedgerShape(done=20, dead=2, running=1, queued=2, planned=1, refused=1, fake_refused=1,
                                       rejected=50))
        # An index build of 0015 interrupted (here: made to fail) leaves an INVALID index of that name.
        with psycopg.connect(scratch_ledger.libpq_url, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute("CREATE UNIQUE INDEX CONCURRENTLY batches_failures_idx ON batches (run_id) "
                             "WHERE failures > 0")
        assert _failures_index(scratch_ledger)[0] is False

        migrate.upgrade(scratch_ledger)
        valid, definition = _failures_index(scratch_ledger)
        assert valid and "UNIQUE" not in definition and "(run_id, failures) WHERE (failures > 0)" in definition
        with engine.connect() as s:
            kept = s.execute(text("SELECT run_id, reason, n FROM run_rejected_counts ORDER BY 1, 2")).all()
            counted = s.execute(text("SELECT run_id, reason, count(*) FROM rejected_rows GROUP BY 1, 2 "
                                     "ORDER BY 1, 2")).all()
        assert kept == counted and sum(n for _, _, n in kept) == 50

        migrate.downgrade(scratch_ledger, "0014")
        assert _failures_index(scratch_ledger) is None
        migrate.upgrade(scratch_ledger)
        assert _failures_index(scratch_ledger)[0] is True
    finally:
        engine.dispose()
