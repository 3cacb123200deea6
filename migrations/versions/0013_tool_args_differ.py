"""Quality class tool_args_differ: a spliced source result answers other arguments than the model's call (issue 60).

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-06

Replaces the check constraint of samples.quality (0004) with one that admits the new
class. The classes are written out, not imported: a migration means the same forever.
(0012 was being written beside this one: this takes the next number after it.)
"""

from alembic import op

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None

BEFORE = ("failed", "empty_answer", "stub_answer", "repetition_loop", "empty_reasoning",
          "truncated_reasoning", "truncated_answer", "bad_think_tags", "unoffered_tool", "invalid_tool_json", "ok")
AFTER = (*BEFORE[:-1], "tool_args_differ", "ok")


def _check(classes: tuple[str, ...]) -> str:
    return "quality IS NULL OR quality IN (" + ", ".join(f"'{c}'" for c in classes) + ")"


def upgrade() -> None:
    op.drop_constraint("samples_quality_check", "samples", type_="check")
    op.create_check_constraint("samples_quality_check", "samples", _check(AFTER))


def downgrade() -> None:
    # Rows of the new class would violate the old constraint: they become unclassified.
    op.execute("UPDATE samples SET quality = NULL WHERE quality = 'tool_args_differ'")
    op.drop_constraint("samples_quality_check", "samples", type_="check")
    op.create_check_constraint("samples_quality_check", "samples", _check(BEFORE))
