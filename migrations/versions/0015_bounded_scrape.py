"""What ``regen metrics`` reads on a scrape, bounded by what is open, not by the done history (issue 58, item 7).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07

The exporter summed every batch of the ledger (``GROUP BY run_id, status``) and counted every
rejected row on each scrape: seconds of reads at 100M samples (1.5M batches, up to a million
rejected rows), every 15-30 s, under an 8 s statement timeout. Most of its figures have a
bounded source already (``run_batch_counts``, ``run_sample_counts``, the partial indexes of
queued and fake batches, migration 0009's index of done batches by finish time, whose last
entry is a run's last commit). Two had none:

* **A run's failed attempts** (``sum(failures)``): a partial index of the batches with
  ``failures > 0``, ``(run_id, failures)``, read whole by an index-only scan. Not a counter
  kept by a trigger: ``failures`` moves on the failure path (``fail``, a lease expiry) and
  ``regen retry --dead``, which the counters' trigger does not watch (it fires only when a
  batch opens or closes); a new trigger there would add a counters write to every failure
  and a lock order to prove against the commit path's. The index costs writes nothing new:
  ``failures`` changes only in statements that change ``status`` too, which are never HOT
  updates (``status`` is indexed), and a batch that never failed is not in it. A scrape reads
  as many entries as batches have ever failed (a few per cent of a run), not its done ones.
* **Rejected rows by reason**: ``run_rejected_counts`` (run, reason, n), kept by statement
  triggers on ``rejected_rows`` (insert, delete, update, truncate) in the writer's
  transaction, as ``run_sample_counts`` is. Only a submit writes rejected rows, one at a time
  per run (its advisory lock), so the rows are not sharded; each statement applies its
  deltas in (run, reason) order all the same. An index-only count of
  ``rejected_rows_run_reason_idx`` would still read every rejected row.

Locks, on a live ledger:

* ``batches``: SHARE UPDATE EXCLUSIVE while the index is built CONCURRENTLY, outside the
  migration's transaction (alembic's ``autocommit_block``): reads and writes go on; it scans
  the table twice and waits for transactions older than it (an export's long snapshot).
  bench/metrics_scale.py times it (docs/ledger.md has the figures). An interrupted build
  leaves an INVALID index; the next upgrade drops and rebuilds it.
* ``rejected_rows``: SHARE ROW EXCLUSIVE from the count of its rows to COMMIT: reads go on,
  a submit's rejected rows wait for one scan of the table (the count) and no more.
* ``runs``: SHARE ROW EXCLUSIVE for the last milliseconds (the new table's foreign key):
  updates of a run's row wait that long; reads and row locks (a claim's join) go on.

Workers need not stop: nothing they read or write changes. Two upgrades at once stay
serialised: migrations/env.py holds its advisory lock for the session, across the commit that
begins the index build, and polls for it rather than waiting in a statement (the build waits
for every transaction holding a snapshot, a waiting upgrade's too).
"""

from alembic import op
from sqlalchemy import text

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

FAILURES_INDEX = "batches_failures_idx"
#: The partial index of batches that ever failed: ``sum(failures)`` per run reads these alone.
CREATE_FAILURES_INDEX = (f"CREATE INDEX CONCURRENTLY {FAILURES_INDEX} ON batches (run_id, failures) "
                         "WHERE failures > 0")

TABLE = """
CREATE TABLE run_rejected_counts (
    run_id integer NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    reason varchar(64) NOT NULL,
    n bigint NOT NULL,
    PRIMARY KEY (run_id, reason)
)"""

FUNCTIONS = """
CREATE FUNCTION rejected_counts_add(p_run integer, p_reason varchar, p_n bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE run_rejected_counts SET n = n + p_n WHERE run_id = p_run AND reason = p_reason;
    -- A run being deleted (cascade) has lost its counts and its row already: nothing to insert.
    IF NOT FOUND AND EXISTS (SELECT 1 FROM runs WHERE id = p_run) THEN
        INSERT INTO run_rejected_counts AS c (run_id, reason, n) VALUES (p_run, p_reason, p_n)
        ON CONFLICT (run_id, reason) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
END
$$;
CREATE FUNCTION rejected_rows_delta() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    -- Old rows out, new rows in, merged per (run, reason) and applied in that order, so two
    -- statements never take two counts rows in opposite orders. INSERT ... ON CONFLICT DO
    -- NOTHING (submit's) lists only the rows it inserted in new_rows.
    IF TG_OP = 'INSERT' THEN
        FOR r IN SELECT run_id, reason, count(*) AS n FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2 LOOP
            PERFORM rejected_counts_add(r.run_id, r.reason, r.n);
        END LOOP;
    ELSIF TG_OP = 'DELETE' THEN
        FOR r IN SELECT run_id, reason, -count(*) AS n FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2 LOOP
            PERFORM rejected_counts_add(r.run_id, r.reason, r.n);
        END LOOP;
    ELSE
        FOR r IN SELECT run_id, reason, sum(n) AS n FROM (
                     SELECT run_id, reason, -1 AS n FROM old_rows
                     UNION ALL
                     SELECT run_id, reason, 1 FROM new_rows
                 ) d GROUP BY 1, 2 HAVING sum(n) <> 0 ORDER BY 1, 2 LOOP
            PERFORM rejected_counts_add(r.run_id, r.reason, r.n);
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;
CREATE FUNCTION rejected_rows_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_rejected_counts;
    RETURN NULL;
END
$$;
CREATE TRIGGER rejected_rows_count_insert AFTER INSERT ON rejected_rows
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION rejected_rows_delta();
CREATE TRIGGER rejected_rows_count_delete AFTER DELETE ON rejected_rows
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION rejected_rows_delta();
CREATE TRIGGER rejected_rows_count_update AFTER UPDATE ON rejected_rows
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION rejected_rows_delta();
CREATE TRIGGER rejected_rows_count_truncate AFTER TRUNCATE ON rejected_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rejected_rows_truncated();
"""


def _index_state(name: str) -> bool | None:
    """True: the index is there and valid; False: an interrupted CONCURRENTLY build left it invalid; None: absent."""
    row = op.get_bind().execute(text(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(:name)"), {"name": name}).first()
    return None if row is None else bool(row[0])


def upgrade() -> None:
    # Outside the transaction: CONCURRENTLY cannot run in one (alembic commits what came before).
    with op.get_context().autocommit_block():
        state = _index_state(FAILURES_INDEX)
        if state is False:
            op.execute(f"DROP INDEX CONCURRENTLY {FAILURES_INDEX}")
        if not state:
            op.execute(CREATE_FAILURES_INDEX)
    # Submits' rejected rows wait from here to COMMIT (reads go on): none lands between the count
    # and the triggers. The count goes to a temporary table first, so that the new table's foreign
    # key, which locks runs against updates, is taken for the last milliseconds only.
    op.execute("LOCK TABLE rejected_rows IN SHARE ROW EXCLUSIVE MODE")
    op.execute("CREATE TEMPORARY TABLE rejected_counts_0015 ON COMMIT DROP AS "
               "SELECT run_id, reason, count(*) AS n FROM rejected_rows GROUP BY 1, 2")
    op.execute(TABLE)
    op.execute("INSERT INTO run_rejected_counts (run_id, reason, n) SELECT run_id, reason, n FROM rejected_counts_0015")
    op.execute(FUNCTIONS)


def downgrade() -> None:
    op.execute("DROP TABLE run_rejected_counts")
    op.execute("DROP TRIGGER rejected_rows_count_insert ON rejected_rows; "
               "DROP TRIGGER rejected_rows_count_delete ON rejected_rows; "
               "DROP TRIGGER rejected_rows_count_update ON rejected_rows; "
               "DROP TRIGGER rejected_rows_count_truncate ON rejected_rows")
    op.execute("DROP FUNCTION rejected_rows_delta(); DROP FUNCTION rejected_rows_truncated(); "
               "DROP FUNCTION rejected_counts_add(integer, varchar, bigint)")
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {FAILURES_INDEX}")
