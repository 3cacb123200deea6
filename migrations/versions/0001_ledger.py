"""The ledger: runs, batches, samples, rejected_rows.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("sampling", JSONB, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("output_url", sa.Text, nullable=False),
        sa.Column("queue", sa.String(200), nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="active"),
        sa.Column("status_reason", sa.Text),
        sa.Column("provenance", JSONB),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("status IN ('active', 'paused', 'finished')", name="runs_status_check"),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="planned"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("failures", sa.Integer, nullable=False, server_default="0"),
        sa.Column("worker", sa.String(200)),
        sa.Column("enqueued_at", TS),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
        sa.Column("heartbeat_at", TS),
        sa.Column("input_key", sa.Text, nullable=False),
        sa.Column("output_key", sa.Text),
        sa.Column("output_sha256", sa.String(64)),
        sa.Column("n_samples", sa.Integer, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger),
        sa.Column("completion_tokens", sa.BigInteger),
        sa.Column("error", sa.Text),
        sa.UniqueConstraint("run_id", "seq", name="batches_run_seq_key"),
        sa.CheckConstraint(
            "status IN ('planned', 'queued', 'running', 'done', 'dead')", name="batches_status_check"
        ),
    )
    op.create_index("batches_run_status_idx", "batches", ["run_id", "status"])
    op.create_table(
        "samples",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("sample_id", sa.Text, primary_key=True),
        sa.Column("batch_id", sa.BigInteger, sa.ForeignKey("batches.id", ondelete="CASCADE"), nullable=False),
        sa.Column("source_file", sa.Text, nullable=False),
        sa.Column("source_row", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("finish_reason", sa.String(32)),
        sa.Column("stop_reason", sa.Text),
        sa.Column("turns", sa.Integer),
        sa.Column("prompt_tokens", sa.BigInteger),
        sa.Column("completion_tokens", sa.BigInteger),
        sa.Column("reasoning_tokens", sa.BigInteger),
        sa.Column("answer_tokens", sa.BigInteger),
        sa.Column("tool_calls", sa.Integer),
        sa.Column("output_key", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("status IN ('pending', 'done', 'failed')", name="samples_status_check"),
    )
    op.create_index("samples_batch_idx", "samples", ["batch_id"])
    op.create_index("samples_run_status_idx", "samples", ["run_id", "status"])
    op.create_table(
        "rejected_rows",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("source_file", sa.Text, nullable=False),
        sa.Column("source_row", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("run_id", "source_file", "source_row", name="rejected_rows_source_key"),
    )
    op.create_index("rejected_rows_run_reason_idx", "rejected_rows", ["run_id", "reason"])


def downgrade() -> None:
    op.drop_table("rejected_rows")
    op.drop_table("samples")
    op.drop_table("batches")
    op.drop_table("runs")
