"""The broker as a moving window of the ledger; lost deliveries found and counted (issues 22, 27).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

``regen submit`` published every batch at once (~1.65 KB of Redis each: 2.6 GB for a
100M-sample run) and the reconciler read the whole queued backlog every pass. Now the
broker holds a window of each queue (ledger/reconcile.py): batches beyond it stay
``planned`` and the reconciler tops the queue up in seq order. The partial indexes keep
every query of a pass to the rows it may act on, whatever the ledger's size:

* ``batches_planned_idx`` (run, seq) of planned batches: the top-up, in seq order;
* ``batches_queued_idx`` (run, enqueued_at) of queued batches: those published longest ago
  and still unclaimed, whose message may have been lost or be held by a dead consumer;
* ``batches_redelivered_idx``: the few batches that got a second message or a stale
  delivery, which ``regen status`` sums.

``stale_deliveries`` counts deliveries acknowledged without work (the batch was done,
dead or held by another live attempt: a duplicate, or an old message Redis handed back
after its visibility timeout); ``republishes`` counts new messages the reconciler gave a
queued batch whose message was neither on the queue nor claimed. ``reconciler_state``
holds one row: when the last pass ran, so that the farm runs one pass per interval
however many workers offer one.
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE batches ADD COLUMN stale_deliveries integer NOT NULL DEFAULT 0, "
               "ADD COLUMN republishes integer NOT NULL DEFAULT 0")
    op.execute("CREATE INDEX batches_planned_idx ON batches (run_id, seq) WHERE status = 'planned'")
    op.execute("CREATE INDEX batches_queued_idx ON batches (run_id, enqueued_at) WHERE status = 'queued'")
    op.execute("CREATE INDEX batches_redelivered_idx ON batches (run_id) "
               "WHERE stale_deliveries > 0 OR republishes > 0")
    op.execute("""
CREATE TABLE reconciler_state (
    id smallint PRIMARY KEY CHECK (id = 1),
    last_pass_at timestamptz NOT NULL,
    last_pass_by text
)""")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS reconciler_state")
    op.execute("DROP INDEX IF EXISTS batches_redelivered_idx")
    op.execute("DROP INDEX IF EXISTS batches_queued_idx")
    op.execute("DROP INDEX IF EXISTS batches_planned_idx")
    op.execute("ALTER TABLE batches DROP COLUMN stale_deliveries, DROP COLUMN republishes")
