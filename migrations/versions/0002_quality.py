"""Quality classes and the gate: samples.quality, runs.quality_thresholds, runs.gate_checked_at.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: Written out, not imported: a migration must mean the same thing forever. A new class
#: in ledger/quality.py needs a migration that replaces this constraint.
QUALITY_CLASSES = ("failed", "empty_answer", "stub_answer", "repetition_loop", "empty_reasoning",
                   "truncated_reasoning", "truncated_answer", "bad_think_tags", "invalid_tool_json", "ok")


def upgrade() -> None:
    # NULL: not classified yet (pending, or written before this revision).
    op.add_column("samples", sa.Column("quality", sa.String(32)))
    op.create_check_constraint(
        "samples_quality_check", "samples",
        "quality IS NULL OR quality IN (" + ", ".join(f"'{c}'" for c in QUALITY_CLASSES) + ")")
    # The gate's aggregate (count by class of one run) reads this index, not the table.
    op.create_index("samples_run_quality_idx", "samples", ["run_id", "quality"])
    # NULL: every default of ledger/quality.py Thresholds; otherwise only the overrides.
    op.add_column("runs", sa.Column("quality_thresholds", JSONB))
    # Last gate evaluation, so that workers evaluate a run at most once per interval.
    op.add_column("runs", sa.Column("gate_checked_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("runs", "gate_checked_at")
    op.drop_column("runs", "quality_thresholds")
    op.drop_index("samples_run_quality_idx", table_name="samples")
    op.drop_constraint("samples_quality_check", "samples", type_="check")
    op.drop_column("samples", "quality")
