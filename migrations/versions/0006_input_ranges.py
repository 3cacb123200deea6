"""Packed input objects: a batch's input shard may be a byte range of a larger object (issue 15).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

A submit wrote one S3 object per batch of 64 rows, and each PUT (with its verifying
HEAD) cost more than its bytes: 14,260 of them were half of a 914K-row submit's CPU,
the producer's and the store's. Now a submit writes one object per group of batches,
each batch's shard a complete zstd frame at a known place in it. The batch row records
where (``input_offset``, ``input_length``) and the frame's SHA-256 (``input_sha256``), so a
worker reads its batch alone (a ranged GET) and verifies it alone, as it verified a
whole object before. NULL in all three: ``input_key`` is the batch's own object (batches
written before this migration, and those of ``regen retry --failed``).
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE batches ADD COLUMN input_offset bigint, ADD COLUMN input_length bigint, "
               "ADD COLUMN input_sha256 varchar(64)")
    op.create_check_constraint(
        "batches_input_range_check", "batches",
        "(input_offset IS NULL AND input_length IS NULL AND input_sha256 IS NULL) OR "
        "(input_offset >= 0 AND input_length > 0 AND input_sha256 IS NOT NULL)")


def downgrade() -> None:
    # Batches in packed objects cannot be described without their ranges: refuse rather than lose them.
    op.execute("""
DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM batches WHERE input_offset IS NOT NULL) THEN
        RAISE EXCEPTION 'batches read their input from packed objects (input_offset set): cannot downgrade';
    END IF;
END $$""")
    op.drop_constraint("batches_input_range_check", "batches", type_="check")
    op.execute("ALTER TABLE batches DROP COLUMN input_offset, DROP COLUMN input_length, DROP COLUMN input_sha256")
