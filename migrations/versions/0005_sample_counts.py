"""run_sample_counts: samples per run, status and quality class, kept by triggers (issue 15).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``regen status`` and the metrics exporter counted samples with ``GROUP BY status`` over
the samples table: 0.5 s on a 914K-sample ledger right after a submit (before autovacuum
sets the visibility map), growing with the ledger, paid by every status call and every
scrape. This table holds the same counts, one row per (run, status, quality class), kept
exact by statement-level triggers on samples: every writer (COPY of a submit, a batch
commit, a retry, ``regen clean``, a hand-written UPDATE) moves them in its own transaction,
so a reader never sees counts that disagree with the rows. Reading them costs a few rows.

The counts rows of a run are hot: every commit of the run updates them, holding their
locks until it commits (milliseconds). The trigger updates them in one order (run,
status, quality) so that concurrent commits queue rather than deadlock.
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

FUNCTION = """
CREATE FUNCTION sample_counts_delta() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        -- Only rows that exist: a run being deleted (cascade) has lost its counts already.
        FOR r IN SELECT run_id, status, coalesce(quality, '') AS quality, count(*) AS n
                 FROM old_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 LOOP
            UPDATE run_sample_counts SET n = n - r.n
            WHERE run_id = r.run_id AND status = r.status AND quality = r.quality;
        END LOOP;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO run_sample_counts AS c (run_id, status, quality, n)
        SELECT run_id, status, coalesce(quality, ''), count(*) FROM new_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (run_id, status, quality) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute("""
CREATE TABLE run_sample_counts (
    run_id integer NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    status varchar(16) NOT NULL,
    quality varchar(32) NOT NULL DEFAULT '',   -- '' : not classified yet (pending samples)
    n bigint NOT NULL,
    PRIMARY KEY (run_id, status, quality)
)""")
    op.execute("LOCK TABLE samples IN SHARE MODE")  # no write between the backfill and the triggers
    op.execute("INSERT INTO run_sample_counts SELECT run_id, status, coalesce(quality, ''), count(*) "
               "FROM samples GROUP BY 1, 2, 3")
    op.execute(FUNCTION)
    op.execute("CREATE TRIGGER samples_counts_insert AFTER INSERT ON samples REFERENCING NEW TABLE AS new_rows "
               "FOR EACH STATEMENT EXECUTE FUNCTION sample_counts_delta()")
    op.execute("CREATE TRIGGER samples_counts_update AFTER UPDATE ON samples REFERENCING OLD TABLE AS old_rows "
               "NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION sample_counts_delta()")
    op.execute("CREATE TRIGGER samples_counts_delete AFTER DELETE ON samples REFERENCING OLD TABLE AS old_rows "
               "FOR EACH STATEMENT EXECUTE FUNCTION sample_counts_delta()")


def downgrade() -> None:
    for name in ("insert", "update", "delete"):
        op.execute(f"DROP TRIGGER IF EXISTS samples_counts_{name} ON samples")
    op.execute("DROP FUNCTION IF EXISTS sample_counts_delta()")
    op.execute("DROP TABLE IF EXISTS run_sample_counts")
