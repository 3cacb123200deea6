"""The ledger's tables (SQLAlchemy 2). The schema is a user interface: see docs/ledger.md.

People query these tables with psql during a run, so columns are plain types with
explicit names, statuses are text (readable in SQL, checked by constraints), and
every time is ``timestamptz``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ledger.states import BatchStatus, Quality, RunStatus, SampleStatus


def _in(column: str, enum) -> str:
    values = ", ".join(f"'{member.value}'" for member in enum)
    return f"{column} IN ({values})"


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    model: Mapped[str] = mapped_column(Text)
    #: Effective sampling (after generation_config defaults), thinking mode, limits.
    sampling: Mapped[dict] = mapped_column(JSONB)
    #: sha256 over model + sampling + everything that changes the outputs; a resubmit must match it.
    config_hash: Mapped[str] = mapped_column(String(64))
    output_url: Mapped[str] = mapped_column(Text)
    queue: Mapped[str] = mapped_column(String(200))
    batch_size: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.ACTIVE.value)
    status_reason: Mapped[str | None] = mapped_column(Text)
    provenance: Mapped[dict | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    #: Overrides of ledger/quality.py Thresholds (NULL = the defaults); see docs/quality.md.
    quality_thresholds: Mapped[dict | None] = mapped_column(JSONB)
    #: Last quality-gate evaluation: workers evaluate a run at most once per interval.
    gate_checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The run's batch counters (open, done, dead, done samples and tokens) are in run_batch_counts,
    # sharded by batch and kept by triggers on batches (migration 0011): no commit writes this row.
    #: Submitted with ``regen submit --benchmark``: the only runs a fake engine may serve (migration 0010).
    benchmark: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))

    __table_args__ = (CheckConstraint(_in("status", RunStatus), name="runs_status_check"),)


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=BatchStatus.PLANNED.value)
    #: Incremented by every claim: the fencing token. Only the holder of the current
    #: attempt may commit the batch.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: Failed attempts (errors, expired leases); the batch is dead at the limit.
    failures: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200))
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    input_key: Mapped[str] = mapped_column(Text)
    #: The batch's shard as a byte range of ``input_key`` (a packed object, migration 0006) and
    #: the range's SHA-256; NULL in all three: the whole object is the batch's shard.
    input_offset: Mapped[int | None] = mapped_column(BigInteger)
    input_length: Mapped[int | None] = mapped_column(BigInteger)
    input_sha256: Mapped[str | None] = mapped_column(String(64))
    output_key: Mapped[str | None] = mapped_column(Text)
    output_sha256: Mapped[str | None] = mapped_column(String(64))
    n_samples: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    completion_tokens: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    #: Deliveries acknowledged without work: the batch was done, dead or held by another live
    #: attempt (a duplicate message, or an old one Redis handed back after its visibility timeout).
    stale_deliveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: New messages the reconciler published because the batch's was neither on the queue nor
    #: claimed after the grace period (lost, or held by a consumer that is gone); migration 0007.
    republishes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The committed output shard was made by a fake engine (its rows carry ``fake_engine``); migration 0010.
    fake: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    #: Deliveries a fake-engine worker refused because the run is not a benchmark run (migration 0010).
    fake_refusals: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (
        UniqueConstraint("run_id", "seq", name="batches_run_seq_key"),
        CheckConstraint(_in("status", BatchStatus), name="batches_status_check"),
        CheckConstraint("(input_offset IS NULL AND input_length IS NULL AND input_sha256 IS NULL) OR "
                        "(input_offset >= 0 AND input_length > 0 AND input_sha256 IS NOT NULL)",
                        name="batches_input_range_check"),
        Index("batches_run_status_idx", "run_id", "status"),
        # The reconciler's queries (migration 0007): bounded by what they may act on.
        Index("batches_planned_idx", "run_id", "seq", postgresql_where=text("status = 'planned'")),
        Index("batches_queued_idx", "run_id", "enqueued_at", postgresql_where=text("status = 'queued'")),
        Index("batches_redelivered_idx", "run_id",
              postgresql_where=text("stale_deliveries > 0 OR republishes > 0")),
        # regen status's recent throughput: the last batches done (migration 0009).
        Index("batches_done_finished_idx", "run_id", "finished_at", postgresql_where=text("status = 'done'")),
        # The few batches a fake engine made or refused (migration 0010): status, export, report.
        Index("batches_fake_idx", "run_id", postgresql_where=text("fake OR fake_refusals > 0")),
        # The batches that ever failed (migration 0015): the exporter's sum of failures reads these alone.
        Index("batches_failures_idx", "run_id", "failures", postgresql_where=text("failures > 0")),
    )


class Sample(Base):
    """The completion ledger: one row per distinct input conversation."""

    __tablename__ = "samples"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    sample_id: Mapped[str] = mapped_column(Text, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    source_file: Mapped[str] = mapped_column(Text)
    source_row: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default=SampleStatus.PENDING.value)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    stop_reason: Mapped[str | None] = mapped_column(Text)
    turns: Mapped[int | None] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    completion_tokens: Mapped[int | None] = mapped_column(BigInteger)
    reasoning_tokens: Mapped[int | None] = mapped_column(BigInteger)
    answer_tokens: Mapped[int | None] = mapped_column(BigInteger)
    tool_calls: Mapped[int | None] = mapped_column(Integer)
    output_key: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), onupdate=func.now()
    )
    #: Quality class (ledger/quality.py) written with the sample at commit; NULL while pending.
    quality: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (
        CheckConstraint(_in("status", SampleStatus), name="samples_status_check"),
        CheckConstraint("quality IS NULL OR " + _in("quality", Quality), name="samples_quality_check"),
        Index("samples_batch_idx", "batch_id"),
        Index("samples_run_status_idx", "run_id", "status"),
        Index("samples_run_quality_idx", "run_id", "quality"),
    )


class RejectedRow(Base):
    """Input rows that never became samples, with the reason (malformed, duplicate id, ...)."""

    __tablename__ = "rejected_rows"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    source_file: Mapped[str] = mapped_column(Text)
    source_row: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(String(64))
    detail: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        # A resubmit of the same files records each bad row once.
        UniqueConstraint("run_id", "source_file", "source_row", name="rejected_rows_source_key"),
        Index("rejected_rows_run_reason_idx", "run_id", "reason"),
    )
    # Counted per run and reason in run_rejected_counts, kept by triggers on this table (migration 0015).


class ReconcilerState(Base):
    """One row: when the farm's last reconciler pass ran and which worker ran it (migration 0007)."""

    __tablename__ = "reconciler_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_pass_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_pass_by: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (CheckConstraint("id = 1", name="reconciler_state_id_check"),)
