"""runs' done and dead counters, and an index of done batches by finish time (issue 22).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

``regen status`` summed the tokens of every done batch, counted the batches by status and
looked for the ones finished in the last 15 minutes with scans of the run's batches: on a
100M-sample run (781K done batches of 1.56M) each took hundreds of milliseconds, and the
status over a second (bench/reconcile_scale.py). The counters below hold those sums: the
trigger of migration 0008 that keeps ``open_batches`` already runs, and locks the run's
row, whenever a batch moves between open (planned, queued, running) and closed (done,
dead), so it keeps them in the same UPDATE, at no new lock and no new trigger. A batch's
tokens are written by the UPDATE that marks it done (ledger/transitions.py ``mark_done``),
and no statement changes a done batch afterwards (``done`` is final; ``dead`` goes back to
``queued`` only), so the sums stay exact.

The partial index serves "the batches finished most recently" (status's throughput): a
walk of its last entries, however many batches are done. Building it reads the table once
(seconds at 1.5M batches) and holds back batch writes meanwhile: run the upgrade between runs
or accept that pause.
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

OPEN = "('planned', 'queued', 'running')"
COUNTERS = ("done_batches", "dead_batches", "done_samples", "done_prompt_tokens", "done_completion_tokens")

#: One batch's contribution to each counter, from a row variable or alias ``b``.
_DELTAS = {
    "done_batches": "(b.status = 'done')::int",
    "dead_batches": "(b.status = 'dead')::int",
    "done_samples": "CASE WHEN b.status = 'done' THEN b.n_samples ELSE 0 END",
    "done_prompt_tokens": "CASE WHEN b.status = 'done' THEN coalesce(b.prompt_tokens, 0) ELSE 0 END",
    "done_completion_tokens": "CASE WHEN b.status = 'done' THEN coalesce(b.completion_tokens, 0) ELSE 0 END",
}


def _set(sign: str, source: str) -> str:
    return ", ".join(f"{c} = {c} {sign} {_DELTAS[c].replace('b.', source + '.')}" for c in COUNTERS)


def _sums(rows: str) -> str:
    return ", ".join(f"sum({expr}) AS {c}" for c, expr in _DELTAS.items()).replace("b.", "") + \
        f", count(*) FILTER (WHERE status IN {OPEN}) AS n FROM {rows} b"


FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION batches_open_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE runs r SET open_batches = r.open_batches + d.n,
               {", ".join(f"{c} = r.{c} + d.{c}" for c in COUNTERS)}
        FROM (SELECT run_id, {_sums("new_rows")} GROUP BY run_id) d
        WHERE r.id = d.run_id;
    ELSE
        -- A run being deleted (cascade) has no row left to update: nothing happens.
        UPDATE runs r SET open_batches = r.open_batches - d.n,
               {", ".join(f"{c} = r.{c} - d.{c}" for c in COUNTERS)}
        FROM (SELECT run_id, {_sums("old_rows")} GROUP BY run_id) d
        WHERE r.id = d.run_id;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION batches_open_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- One UPDATE per run touched, as before: the old row's part out, the new row's in.
    IF OLD.run_id = NEW.run_id THEN
        UPDATE runs SET open_batches = open_batches - (OLD.status IN {OPEN})::int + (NEW.status IN {OPEN})::int,
               {", ".join(f"{c} = {c} - {_DELTAS[c].replace('b.', 'OLD.')} + {_DELTAS[c].replace('b.', 'NEW.')}"
                          for c in COUNTERS)}
        WHERE id = NEW.run_id;
    ELSE
        UPDATE runs SET open_batches = open_batches - (OLD.status IN {OPEN})::int, {_set("-", "OLD")}
        WHERE id = OLD.run_id;
        UPDATE runs SET open_batches = open_batches + (NEW.status IN {OPEN})::int, {_set("+", "NEW")}
        WHERE id = NEW.run_id;
    END IF;
    RETURN NULL;
END
$$;
"""

PREVIOUS = f"""
CREATE OR REPLACE FUNCTION batches_open_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE runs r SET open_batches = r.open_batches + d.n
        FROM (SELECT run_id, count(*) AS n FROM new_rows WHERE status IN {OPEN} GROUP BY run_id) d
        WHERE r.id = d.run_id;
    ELSE
        UPDATE runs r SET open_batches = r.open_batches - d.n
        FROM (SELECT run_id, count(*) AS n FROM old_rows WHERE status IN {OPEN} GROUP BY run_id) d
        WHERE r.id = d.run_id;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION batches_open_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN {OPEN} THEN
        UPDATE runs SET open_batches = open_batches - 1 WHERE id = OLD.run_id;
    END IF;
    IF NEW.status IN {OPEN} THEN
        UPDATE runs SET open_batches = open_batches + 1 WHERE id = NEW.run_id;
    END IF;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    for c in COUNTERS:
        op.execute(f"ALTER TABLE runs ADD COLUMN {c} bigint NOT NULL DEFAULT 0")
    op.execute("LOCK TABLE batches IN SHARE MODE")  # no write between the backfill and the new functions
    op.execute(f"UPDATE runs r SET {', '.join(f'{c} = d.{c}' for c in COUNTERS)} "
               f"FROM (SELECT run_id, {_sums('batches')} GROUP BY run_id) d WHERE r.id = d.run_id")
    op.execute(FUNCTIONS)
    op.execute("CREATE INDEX batches_done_finished_idx ON batches (run_id, finished_at) WHERE status = 'done'")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS batches_done_finished_idx")
    op.execute(PREVIOUS)
    for c in COUNTERS:
        op.execute(f"ALTER TABLE runs DROP COLUMN {c}")
