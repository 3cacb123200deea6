"""The run's counters sharded by batch, and "drained" read from a partial index (issues 61 and 58).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

Every commit of a run wrote two rows that every other commit of that run also wrote: the
run's pending-count row of ``run_sample_counts`` (migration 0005's trigger) and the ``runs``
row (the open and done counters of migrations 0008 and 0009). Each commit held both to its
COMMIT, so a run's commits queued one behind the other's WAL flush: 172-187 commits/s back
to back on 16 cores, 49-52/s with a p99 of 2.8 s under a 1,000-GPU farm's load (issue 61).
A submit group took the same two rows in the other order, and deadlocked with commits
(issue 58, item 2).

Now:

* ``run_sample_counts`` has a ``shard`` (``batch_id % 64`` of the samples counted): a
  commit moves only its batch's shard rows. Readers sum over the shards (they already
  summed over quality classes). The rows of before this migration stay in shard 0: a
  shard's ``n`` may go below zero (a commit's decrement lands in its batch's shard), the
  sums stay exact.
* ``run_batch_counts`` holds the counters that were ``runs.open_batches``, ``done_batches``,
  ``dead_batches``, ``done_samples``, ``done_prompt_tokens`` and ``done_completion_tokens``,
  one row per (run, ``id % 64`` of the batches counted; -1 for batches inserted); those columns
  of ``runs`` go. The same triggers on ``batches`` keep them.
* Each trigger applies its deltas in (run, shard, status, quality) order, decrements and
  increments merged, so two statements never take two counters rows in opposite orders.
  Inserted batches are counted in a shard of their own (-1) that no commit writes: a submit
  group takes the batch counters before its samples' (a batch comes before its samples), a
  commit its samples' before its batch's, and with no counters row in common the two orders
  cannot meet in a cycle (docs/ledger.md, "The commit path").
* The finish check (ledger/transitions.py ``finish_run_if_drained``) sums the run's
  ``open_batches`` shards in a transaction of its own after the commit, instead of reading
  ``runs.open_batches`` under the run's row lock. (Not an ``EXISTS`` over the open batches:
  for a run mostly done the planner chose to read ``batches`` from its start, 2,216 buffers
  at 95% of 100K batches, with a partial index of the open ones beside it.)

Locks, on a live ledger: ``batches`` and ``samples`` in SHARE mode (writes wait, reads go on),
then ``run_sample_counts`` and ``runs`` in ACCESS EXCLUSIVE mode, all to the end: a new key,
a new table of a few rows per run, new functions and dropped columns, with no rewrite and no
scan of ``batches`` or ``samples``, so its time does not grow with the ledger
(bench/migration_locks.py: docs/ledger.md has the figures). Workers of the regen before must be stopped first: their finish
check reads the dropped ``runs.open_batches`` (docs/ledger.md says what an operator does).
"""

import importlib

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

#: Shards per run: a commit writes only its batch's shard. 64 keeps two of 16 back-to-back
#: committers on one shard rare, and a reader's sum small (64 rows per counter and class).
SHARDS = 64
#: The batch counters' shard of inserted batches (submit, retry --failed): one no commit writes.
INSERTED_SHARD = -1
OPEN = "('planned', 'queued', 'running')"
COUNTERS = ("open_batches", "done_batches", "dead_batches", "done_samples", "done_prompt_tokens",
            "done_completion_tokens")

#: One batch's part in each counter, from a row variable or alias ``b``.
_PARTS = {
    "open_batches": f"(b.status IN {OPEN})::int",
    "done_batches": "(b.status = 'done')::int",
    "dead_batches": "(b.status = 'dead')::int",
    "done_samples": "CASE WHEN b.status = 'done' THEN b.n_samples ELSE 0 END",
    "done_prompt_tokens": "CASE WHEN b.status = 'done' THEN coalesce(b.prompt_tokens, 0) ELSE 0 END",
    "done_completion_tokens": "CASE WHEN b.status = 'done' THEN coalesce(b.completion_tokens, 0) ELSE 0 END",
}


def _part(counter: str, row: str) -> str:
    return _PARTS[counter].replace("b.", row + ".")


_ADD_ARGS = ", ".join(f"p_{c} bigint" for c in COUNTERS)

FUNCTIONS = f"""
CREATE FUNCTION sample_counts_add(p_run integer, p_shard smallint, p_status varchar, p_quality varchar, p_n bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE run_sample_counts SET n = n + p_n
    WHERE run_id = p_run AND shard = p_shard AND status = p_status AND quality = p_quality;
    -- A run being deleted (cascade) has lost its counts and its row already: nothing to insert.
    IF NOT FOUND AND EXISTS (SELECT 1 FROM runs WHERE id = p_run) THEN
        INSERT INTO run_sample_counts AS c (run_id, shard, status, quality, n)
        VALUES (p_run, p_shard, p_status, p_quality, p_n)
        ON CONFLICT (run_id, shard, status, quality) DO UPDATE SET n = c.n + EXCLUDED.n;
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION sample_counts_delta() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    -- Old rows out, new rows in, merged per (run, shard, status, quality) and applied in that
    -- order: a commit's decrement and increments, a submit's COPY over 32 batches, a retry's
    -- move between shards all take their counters rows in one order, so none deadlocks another.
    IF TG_OP = 'INSERT' THEN
        FOR r IN SELECT run_id, mod(batch_id, {SHARDS})::smallint AS shard, status, coalesce(quality, '') AS quality,
                        count(*) AS n
                 FROM new_rows GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4 LOOP
            PERFORM sample_counts_add(r.run_id, r.shard, r.status, r.quality, r.n);
        END LOOP;
    ELSIF TG_OP = 'DELETE' THEN
        FOR r IN SELECT run_id, mod(batch_id, {SHARDS})::smallint AS shard, status, coalesce(quality, '') AS quality,
                        -count(*) AS n
                 FROM old_rows GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4 LOOP
            PERFORM sample_counts_add(r.run_id, r.shard, r.status, r.quality, r.n);
        END LOOP;
    ELSE
        FOR r IN SELECT run_id, shard, status, quality, sum(n) AS n FROM (
                     SELECT run_id, mod(batch_id, {SHARDS})::smallint AS shard, status,
                            coalesce(quality, '') AS quality, -1 AS n FROM old_rows
                     UNION ALL
                     SELECT run_id, mod(batch_id, {SHARDS})::smallint, status, coalesce(quality, ''), 1 FROM new_rows
                 ) d GROUP BY 1, 2, 3, 4 HAVING sum(n) <> 0 ORDER BY 1, 2, 3, 4 LOOP
            PERFORM sample_counts_add(r.run_id, r.shard, r.status, r.quality, r.n);
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;
CREATE FUNCTION batch_counts_add(p_run integer, p_shard smallint, {_ADD_ARGS})
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE run_batch_counts SET {", ".join(f"{c} = {c} + p_{c}" for c in COUNTERS)}
    WHERE run_id = p_run AND shard = p_shard;
    IF NOT FOUND AND EXISTS (SELECT 1 FROM runs WHERE id = p_run) THEN
        INSERT INTO run_batch_counts AS c (run_id, shard, {", ".join(COUNTERS)})
        VALUES (p_run, p_shard, {", ".join(f"p_{c}" for c in COUNTERS)})
        ON CONFLICT (run_id, shard) DO UPDATE SET {", ".join(f"{c} = c.{c} + EXCLUDED.{c}" for c in COUNTERS)};
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION batches_open_rows() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
    direction int := CASE WHEN TG_OP = 'INSERT' THEN 1 ELSE -1 END;
BEGIN
    -- New batches (a submit group, a retry) are counted in a shard of their own, which no commit
    -- writes: a submit group, which takes these counters before its samples' (a batch comes before
    -- its samples), then never holds a row that a commit, which takes its samples' first, waits for.
    IF TG_OP = 'INSERT' THEN
        FOR r IN SELECT run_id, {INSERTED_SHARD}::smallint AS shard,
                        {", ".join(f"sum({_part(c, 'b')})::bigint AS {c}" for c in COUNTERS)}
                 FROM new_rows b GROUP BY 1, 2 ORDER BY 1, 2 LOOP
            PERFORM batch_counts_add(r.run_id, r.shard, {", ".join(f"direction * r.{c}" for c in COUNTERS)});
        END LOOP;
    ELSE
        FOR r IN SELECT run_id, mod(id, {SHARDS})::smallint AS shard,
                        {", ".join(f"sum({_part(c, 'b')})::bigint AS {c}" for c in COUNTERS)}
                 FROM old_rows b GROUP BY 1, 2 ORDER BY 1, 2 LOOP
            PERFORM batch_counts_add(r.run_id, r.shard, {", ".join(f"direction * r.{c}" for c in COUNTERS)});
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION batches_open_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The batch's own shard only: the old row's part out, the new row's in.
    IF OLD.run_id = NEW.run_id THEN
        PERFORM batch_counts_add(NEW.run_id, mod(NEW.id, {SHARDS})::smallint,
                                 {", ".join(f"{_part(c, 'NEW')} - {_part(c, 'OLD')}" for c in COUNTERS)});
    ELSE
        PERFORM batch_counts_add(OLD.run_id, mod(OLD.id, {SHARDS})::smallint,
                                 {", ".join(f"-{_part(c, 'OLD')}" for c in COUNTERS)});
        PERFORM batch_counts_add(NEW.run_id, mod(NEW.id, {SHARDS})::smallint,
                                 {", ".join(_part(c, 'NEW') for c in COUNTERS)});
    END IF;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    # Writes to batches and samples wait from here to the end (reads go on): no counter moves
    # between the copies below and the new functions.
    op.execute("LOCK TABLE batches, samples IN SHARE MODE")
    # The counts so far become shard 0 of each run: no scan of samples, the sums unchanged.
    op.execute("ALTER TABLE run_sample_counts ADD COLUMN shard smallint NOT NULL DEFAULT 0, "
               "DROP CONSTRAINT run_sample_counts_pkey")
    op.execute("ALTER TABLE run_sample_counts ADD PRIMARY KEY (run_id, shard, status, quality)")
    op.execute(f"""
CREATE TABLE run_batch_counts (
    run_id integer NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    shard smallint NOT NULL,
    {", ".join(f"{c} bigint NOT NULL DEFAULT 0" for c in COUNTERS)},
    PRIMARY KEY (run_id, shard)
)""")
    op.execute(f"INSERT INTO run_batch_counts (run_id, shard, {', '.join(COUNTERS)}) "
               f"SELECT id, 0, {', '.join(COUNTERS)} FROM runs")
    op.execute(FUNCTIONS)
    op.execute("ALTER TABLE runs DROP CONSTRAINT runs_open_batches_check, "
               + ", ".join(f"DROP COLUMN {c}" for c in COUNTERS))


def downgrade() -> None:
    v5 = importlib.import_module("migrations.versions.0005_sample_counts")
    v9 = importlib.import_module("migrations.versions.0009_done_counters")
    op.execute("LOCK TABLE batches, samples IN SHARE MODE")
    op.execute("ALTER TABLE runs " + ", ".join(f"ADD COLUMN {c} bigint NOT NULL DEFAULT 0" for c in COUNTERS))
    op.execute(f"UPDATE runs r SET {', '.join(f'{c} = d.{c}' for c in COUNTERS)} FROM (SELECT run_id, "
               f"{', '.join(f'sum({c}) AS {c}' for c in COUNTERS)} FROM run_batch_counts GROUP BY run_id) d "
               "WHERE r.id = d.run_id")
    op.execute("ALTER TABLE runs ADD CONSTRAINT runs_open_batches_check CHECK (open_batches >= 0)")
    op.execute(v9.FUNCTIONS)
    op.execute("DROP TABLE run_batch_counts")
    op.execute("CREATE TEMPORARY TABLE sample_counts_0011 ON COMMIT DROP AS SELECT run_id, status, quality, "
               "sum(n) AS n FROM run_sample_counts GROUP BY 1, 2, 3")
    op.execute("DELETE FROM run_sample_counts")
    op.execute("ALTER TABLE run_sample_counts DROP CONSTRAINT run_sample_counts_pkey, DROP COLUMN shard")
    op.execute("ALTER TABLE run_sample_counts ADD PRIMARY KEY (run_id, status, quality)")
    op.execute("INSERT INTO run_sample_counts SELECT run_id, status, quality, n FROM sample_counts_0011")
    op.execute(v5.FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
    op.execute("DROP FUNCTION sample_counts_add(integer, smallint, varchar, varchar, bigint)")
    op.execute(f"DROP FUNCTION batch_counts_add(integer, smallint, {', '.join('bigint' for _ in COUNTERS)})")
