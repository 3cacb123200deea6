"""Quality class unoffered_tool: a call to a tool the sample did not offer (issue 12).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Replaces the check constraint of samples.quality (0002) with one that admits the new
class. The classes are written out, not imported: a migration means the same forever.
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BEFORE = ("failed", "empty_answer", "stub_answer", "repetition_loop", "empty_reasoning",
          "truncated_reasoning", "truncated_answer", "bad_think_tags", "invalid_tool_json", "ok")
AFTER = ("failed", "empty_answer", "stub_answer", "repetition_loop", "empty_reasoning",
         "truncated_reasoning", "truncated_answer", "bad_think_tags", "unoffered_tool", "invalid_tool_json", "ok")


def _check(classes: tuple[str, ...]) -> str:
    return "quality IS NULL OR quality IN (" + ", ".join(f"'{c}'" for c in classes) + ")"


def upgrade() -> None:
    op.drop_constraint("samples_quality_check", "samples", type_="check")
    op.create_check_constraint("samples_quality_check", "samples", _check(AFTER))


def downgrade() -> None:
    # Rows of the new class would violate the old constraint: they become unclassified.
    op.execute("UPDATE samples SET quality = NULL WHERE quality = 'unoffered_tool'")
    op.drop_constraint("samples_quality_check", "samples", type_="check")
    op.create_check_constraint("samples_quality_check", "samples", _check(BEFORE))
