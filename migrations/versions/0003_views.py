"""Views for the people who run regen: progress, throughput, failures, batch timings.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Plain SQL views over the ledger (docs/sql.md shows how to query them). They hold
no data, so they cost nothing until queried, and every figure is recomputed from
the tables at query time. A later migration that changes a column one of these
views reads must DROP the view and CREATE it again (Postgres refuses to alter a
column a view depends on); ``downgrade`` here shows the order.
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# How many GPUs a worker process drives, read from the name the launcher gives it
# (worker/process/launcher.py: gpu3@host, gpu0-1@host for a tensor-parallel pair). NULL
# for CPU workers and hand-named workers, so a per-GPU figure is never invented.
WORKER_GPUS = """
CREATE FUNCTION worker_gpus(worker text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN worker ~ '^gpu[0-9]+(-[0-9]+)*@'
                THEN array_length(string_to_array(substring(worker FROM '^gpu([0-9-]+)@'), '-'), 1)
           END
$$
"""

# One row per run. Sample figures come from `samples` (the completion ledger), batch
# figures from `batches`; `bad_quality` counts done samples whose quality class
# (revision 0002, ledger/quality.py) is not 'ok'. Rates are averages over the run's active span: from the
# start of the earliest attempt on record to the last commit.
RUN_PROGRESS = """
CREATE VIEW run_progress AS
WITH s AS (
    SELECT run_id,
           count(*) AS samples,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'done') AS done,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'done' AND finish_reason = 'length') AS truncated,
           count(*) FILTER (WHERE status = 'done' AND quality IS NOT NULL AND quality <> 'ok') AS bad_quality,
           coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
           coalesce(sum(completion_tokens), 0) AS completion_tokens,
           coalesce(sum(reasoning_tokens), 0) AS reasoning_tokens
    FROM samples GROUP BY run_id
), b AS (
    SELECT run_id,
           count(*) AS batches,
           count(*) FILTER (WHERE status IN ('planned', 'queued')) AS batches_waiting,
           count(*) FILTER (WHERE status = 'running') AS batches_running,
           count(*) FILTER (WHERE status = 'done') AS batches_done,
           count(*) FILTER (WHERE status = 'dead') AS batches_dead,
           min(started_at) AS first_started_at,
           max(finished_at) FILTER (WHERE status = 'done') AS last_finished_at
    FROM batches GROUP BY run_id
), j AS (
    SELECT run_id,
           count(*) FILTER (WHERE reason <> 'duplicate_id') AS rejected,
           count(*) FILTER (WHERE reason = 'duplicate_id') AS duplicates
    FROM rejected_rows GROUP BY run_id
), joined AS (
    SELECT r.id AS run_id, r.name AS run, r.model, r.queue, r.status, r.status_reason, r.created_at,
           coalesce(s.samples, 0) AS samples, coalesce(s.pending, 0) AS pending,
           coalesce(s.done, 0) AS done, coalesce(s.failed, 0) AS failed,
           coalesce(s.truncated, 0) AS truncated, coalesce(s.bad_quality, 0) AS bad_quality,
           coalesce(j.rejected, 0) AS rejected, coalesce(j.duplicates, 0) AS duplicates,
           coalesce(b.batches, 0) AS batches, coalesce(b.batches_waiting, 0) AS batches_waiting,
           coalesce(b.batches_running, 0) AS batches_running, coalesce(b.batches_done, 0) AS batches_done,
           coalesce(b.batches_dead, 0) AS batches_dead,
           coalesce(s.prompt_tokens, 0) AS prompt_tokens,
           coalesce(s.completion_tokens, 0) AS completion_tokens,
           coalesce(s.reasoning_tokens, 0) AS reasoning_tokens,
           b.first_started_at, b.last_finished_at,
           extract(epoch FROM b.last_finished_at - b.first_started_at)::numeric AS active_s
    FROM runs r
    LEFT JOIN s ON s.run_id = r.id
    LEFT JOIN b ON b.run_id = r.id
    LEFT JOIN j ON j.run_id = r.id
)
SELECT run_id, run, model, queue, status, status_reason, created_at,
       samples, pending, done, failed, truncated, bad_quality, rejected, duplicates,
       round(100.0 * done / nullif(samples, 0), 2) AS done_pct,
       round(100.0 * (done + failed) / nullif(samples, 0), 2) AS settled_pct,
       batches, batches_waiting, batches_running, batches_done, batches_dead,
       prompt_tokens, completion_tokens, reasoning_tokens,
       first_started_at, last_finished_at, round(active_s, 1) AS active_s,
       round(completion_tokens / nullif(active_s, 0), 1) AS completion_tokens_per_s,
       round(done / nullif(active_s, 0), 3) AS samples_per_s
FROM joined
"""

# Per worker process and clock hour, from the batches it committed. A batch counts
# in the hour it finished (a batch of 50 minutes lands in one hour). The rate
# divides by the hour's length, or by the part of the current hour gone so far.
WORKER_THROUGHPUT_HOURLY = """
CREATE VIEW worker_throughput_hourly AS
SELECT date_trunc('hour', b.finished_at) AS hour,
       b.worker,
       worker_gpus(b.worker) AS gpus,
       string_agg(DISTINCT r.name, ',') AS runs,
       count(*) AS batches,
       sum(b.n_samples) AS samples,
       coalesce(sum(b.prompt_tokens), 0) AS prompt_tokens,
       coalesce(sum(b.completion_tokens), 0) AS completion_tokens,
       round(avg(extract(epoch FROM b.finished_at - b.started_at))::numeric, 1) AS avg_batch_s,
       round(coalesce(sum(b.completion_tokens), 0)
             / greatest(1.0, least(3600.0, extract(epoch FROM now() - date_trunc('hour', b.finished_at))::numeric)),
             1) AS completion_tokens_per_s
FROM batches b JOIN runs r ON r.id = b.run_id
WHERE b.status = 'done' AND b.worker IS NOT NULL
GROUP BY date_trunc('hour', b.finished_at), b.worker
"""

# Everything that did not become a good sample, per run and reason code:
#   sample_failed  samples.error is "code: detail" (worker/conversation/generation.py); grouped by code
#   batch_dead     batches that reached the failure limit; grouped by the start of their error
#   rejected       input rows that never became samples (producer/dataset/reasons.py codes)
#   duplicate      rows whose id repeated an earlier row's (the first one won)
FAILURES_BY_REASON = """
CREATE VIEW failures_by_reason AS
SELECT r.id AS run_id, r.name AS run, 'sample_failed'::text AS kind,
       split_part(coalesce(s.error, 'unknown'), ':', 1) AS reason, count(*) AS n,
       min(s.sample_id) AS example
FROM samples s JOIN runs r ON r.id = s.run_id
WHERE s.status = 'failed'
GROUP BY r.id, r.name, split_part(coalesce(s.error, 'unknown'), ':', 1)
UNION ALL
SELECT r.id, r.name, 'batch_dead', split_part(coalesce(b.error, 'unknown'), ':', 1), count(*),
       'batch ' || min(b.seq)
FROM batches b JOIN runs r ON r.id = b.run_id
WHERE b.status = 'dead'
GROUP BY r.id, r.name, split_part(coalesce(b.error, 'unknown'), ':', 1)
UNION ALL
SELECT r.id, r.name, CASE WHEN j.reason = 'duplicate_id' THEN 'duplicate' ELSE 'rejected' END, j.reason,
       count(*), min(j.source_file || ':' || j.source_row)
FROM rejected_rows j JOIN runs r ON r.id = j.run_id
GROUP BY r.id, r.name, j.reason
"""

# One row per committed batch: how long its successful attempt took and how fast it went.
BATCH_DURATIONS = """
CREATE VIEW batch_durations AS
SELECT b.id AS batch_id, b.run_id, r.name AS run, b.seq, b.worker, worker_gpus(b.worker) AS gpus,
       b.attempts, b.failures, b.n_samples, b.prompt_tokens, b.completion_tokens,
       b.enqueued_at, b.started_at, b.finished_at,
       round(extract(epoch FROM b.finished_at - b.started_at)::numeric, 1) AS duration_s,
       round(b.completion_tokens / nullif(extract(epoch FROM b.finished_at - b.started_at)::numeric, 0), 1)
           AS completion_tokens_per_s
FROM batches b JOIN runs r ON r.id = b.run_id
WHERE b.status = 'done'
"""

# Who holds which batch right now, since when, and how fresh its lease is. A
# heartbeat older than the workers' --lease-s means the holder is presumed dead.
RUNNING_BATCHES = """
CREATE VIEW running_batches AS
SELECT b.id AS batch_id, b.run_id, r.name AS run, b.seq, b.worker, b.attempts AS attempt, b.failures,
       b.n_samples, b.started_at, b.heartbeat_at,
       round(extract(epoch FROM now() - b.started_at)::numeric, 1) AS running_s,
       round(extract(epoch FROM now() - b.heartbeat_at)::numeric, 1) AS heartbeat_age_s
FROM batches b JOIN runs r ON r.id = b.run_id
WHERE b.status = 'running'
"""

# The quality class (revision 0002, ledger/quality.py) of every classified sample (done or
# failed), per run, with its share: the same denominator the quality gate uses.
QUALITY_BY_RUN = """
CREATE VIEW quality_by_run AS
SELECT r.id AS run_id, r.name AS run, s.quality, count(*) AS n,
       round(100.0 * count(*) / sum(count(*)) OVER (PARTITION BY r.id), 2) AS pct
FROM samples s JOIN runs r ON r.id = s.run_id
WHERE s.quality IS NOT NULL
GROUP BY r.id, r.name, s.quality
"""

VIEWS = ["run_progress", "worker_throughput_hourly", "failures_by_reason", "batch_durations", "running_batches",
         "quality_by_run"]


def upgrade() -> None:
    for statement in (WORKER_GPUS, RUN_PROGRESS, WORKER_THROUGHPUT_HOURLY, FAILURES_BY_REASON, BATCH_DURATIONS,
                      RUNNING_BATCHES, QUALITY_BY_RUN):
        op.execute(statement)


def downgrade() -> None:
    for view in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    op.execute("DROP FUNCTION IF EXISTS worker_gpus(text)")
