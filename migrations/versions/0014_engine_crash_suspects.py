"""The samples in flight when an engine died: a poison sample is found and failed, nobody else charged (issue 58, item 4).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

A sample that makes the engine exit (a vLLM bug its prompt triggers) used to be charged to
whichever batch noticed the death first: the poison went round from engine to engine, each
crash costing a reload and everything in flight, and innocent batches collected the failures.

Now no batch is charged for an engine death. Each batch in flight records its conversations
that had started and not ended (``crashes`` + 1 each). A suspect (``crashes`` >= 1) runs
*isolated* on its next attempt: at most one isolated sample per engine at a time, so when an
engine dies with one isolated sample in flight, that sample is the only suspect in flight
(the others beside it had never been in a crash): its ``isolated_crashes`` + 1. A sample with
two isolated crashes is the poison: its batch's next attempt fails it with reason
``engine_crash`` without running it, and commits the rest. Two, not one: a second poison
among fresh samples crashing beside an innocent isolated suspect must not condemn it. So a
poison is failed within three engine deaths (one as a suspect, two isolated).
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE engine_crash_suspects (
    batch_id bigint NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
    sample_id text NOT NULL,
    crashes integer NOT NULL DEFAULT 0,
    isolated_crashes integer NOT NULL DEFAULT 0,
    last_crash_at timestamptz NOT NULL DEFAULT now(),
    last_crash_by text,
    PRIMARY KEY (batch_id, sample_id)
)""")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS engine_crash_suspects")
