"""runs.open_batches: batches of a run not yet done or dead, kept by triggers (issue 22).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Every commit asked "is anything of this run left?" with ``NOT EXISTS (SELECT 1 FROM batches
WHERE run_id = ... AND status NOT IN ('done', 'dead'))``: a walk over every done batch of the
run, 113-176 ms on a 100M-sample run, inside the run's row lock that serialises commits.
Written as ``status IN ('planned', 'queued', 'running')`` it is no better: the planner
expects many open rows and reads the table from its start (seen on 200K to 1M batches).
This column is the number itself, so the finish check reads one row.

It changes only when a batch moves between open (planned, queued, running) and closed
(done, dead), or is inserted or deleted: a row trigger on ``UPDATE OF status`` whose WHEN
lets claims, hand-backs and heartbeats pass without running it, and statement triggers
on insert and delete (a submit inserts its batches by the thousand). The decrement of a
commit locks the run's row until that commit ends: the lock that makes "the last commit
sees 0" true, as the ``SELECT ... FOR UPDATE`` it replaces did.
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

OPEN = "('planned', 'queued', 'running')"

FUNCTIONS = f"""
CREATE FUNCTION batches_open_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE runs r SET open_batches = r.open_batches + d.n
        FROM (SELECT run_id, count(*) AS n FROM new_rows WHERE status IN {OPEN} GROUP BY run_id) d
        WHERE r.id = d.run_id;
    ELSE
        -- A run being deleted (cascade) has no row left to update: nothing happens.
        UPDATE runs r SET open_batches = r.open_batches - d.n
        FROM (SELECT run_id, count(*) AS n FROM old_rows WHERE status IN {OPEN} GROUP BY run_id) d
        WHERE r.id = d.run_id;
    END IF;
    RETURN NULL;
END
$$;
CREATE FUNCTION batches_open_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN {OPEN} THEN
        UPDATE runs SET open_batches = open_batches - 1 WHERE id = OLD.run_id;
    END IF;
    IF NEW.status IN {OPEN} THEN
        UPDATE runs SET open_batches = open_batches + 1 WHERE id = NEW.run_id;
    END IF;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN open_batches bigint NOT NULL DEFAULT 0")
    op.execute("LOCK TABLE batches IN SHARE MODE")  # no write between the backfill and the triggers
    op.execute(f"UPDATE runs r SET open_batches = d.n FROM (SELECT run_id, count(*) AS n FROM batches "
               f"WHERE status IN {OPEN} GROUP BY run_id) d WHERE r.id = d.run_id")
    op.execute(FUNCTIONS)
    op.execute("CREATE TRIGGER batches_open_insert AFTER INSERT ON batches REFERENCING NEW TABLE AS new_rows "
               "FOR EACH STATEMENT EXECUTE FUNCTION batches_open_rows()")
    op.execute("CREATE TRIGGER batches_open_delete AFTER DELETE ON batches REFERENCING OLD TABLE AS old_rows "
               "FOR EACH STATEMENT EXECUTE FUNCTION batches_open_rows()")
    op.execute(f"CREATE TRIGGER batches_open_status AFTER UPDATE OF status, run_id ON batches FOR EACH ROW "
               f"WHEN ((OLD.status IN {OPEN}) IS DISTINCT FROM (NEW.status IN {OPEN}) OR OLD.run_id <> NEW.run_id) "
               f"EXECUTE FUNCTION batches_open_status()")
    op.execute("ALTER TABLE runs ADD CONSTRAINT runs_open_batches_check CHECK (open_batches >= 0)")


def downgrade() -> None:
    for name in ("insert", "delete", "status"):
        op.execute(f"DROP TRIGGER IF EXISTS batches_open_{name} ON batches")
    op.execute("DROP FUNCTION IF EXISTS batches_open_rows()")
    op.execute("DROP FUNCTION IF EXISTS batches_open_status()")
    op.execute("ALTER TABLE runs DROP COLUMN open_batches")
