"""Benchmark runs, and fake output marked in the ledger (issue 36, part 1).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

A fake-engine worker (worker/engine/fake.py: random token ids, for benchmarks and tests of
the control plane) used to serve any run it found on its queue: one started by mistake on a
farm's queue turned real samples into random tokens, and nothing downstream told them apart
(the run's provenance is written by its first committed batch only). Now:

* ``runs.benchmark``: the run was submitted with ``regen submit --benchmark``. Only such a
  run's batches can be claimed by a fake engine (ledger/transitions.py ``claim``); a real
  run's batches are refused by it before any attempt is taken.
* ``batches.fake``: the batch's committed output shard was made by a fake engine (its rows
  carry ``fake_engine``); written by the commit from the shard's own rows.
* ``batches.fake_refusals``: deliveries a fake worker refused because the run is not a
  benchmark run (the message went back to the queue, no attempt and no failure counted).

``regen status``, ``regen metrics``, ``regen report`` and ``regen export`` read the last two
through ``batches_fake_idx``: only the few batches concerned, whatever the ledger's size.
No existing run is made a benchmark run: an old fake run's remaining batches are refused by
fake workers, and its fake rows are still told by the ``fake_engine`` field of each row.
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN benchmark boolean NOT NULL DEFAULT false")
    op.execute("ALTER TABLE batches ADD COLUMN fake boolean NOT NULL DEFAULT false, "
               "ADD COLUMN fake_refusals integer NOT NULL DEFAULT 0")
    op.execute("CREATE INDEX batches_fake_idx ON batches (run_id) WHERE fake OR fake_refusals > 0")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS batches_fake_idx")
    op.execute("ALTER TABLE batches DROP COLUMN fake, DROP COLUMN fake_refusals")
    op.execute("ALTER TABLE runs DROP COLUMN benchmark")
