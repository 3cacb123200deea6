"""pytest plugin: the fault-injection table (issue 4's acceptance).

Each fault test records one row: the fault, how many batches and samples were
expected, and what the ledger and the output shards say happened. The table is
printed at the end of the session and written to fault-report.txt.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger.objects import ObjectStore
from ledger.shards import decode_shard

_ROWS: list[FaultRow] = []


@dataclass
class FaultRow:
    fault: str
    batches: int
    expected: int
    done: int
    failed: int
    #: Pending in a batch that died after its attempts: visible in status with the batch's
    #: error, never acknowledged as done, and queued again by ``regen retry --dead``.
    dead: int
    #: Neither done, failed nor in a dead batch (or marked done with no output row): gone.
    lost: int
    dup_ledger: int
    dup_outputs: int


def account(sessions, run_name: str, *, expected_ids: set[str]) -> FaultRow:
    """What happened to every expected sample, from the ledger and from the shards it points to."""
    with sessions() as s:
        run_id = s.execute(text("SELECT id FROM runs WHERE name = :n"), {"n": run_name}).scalar_one()
        rows = s.execute(text("SELECT s.sample_id, s.status, s.output_key, b.status AS batch_status "
                              "FROM samples s LEFT JOIN batches b ON b.id = s.batch_id WHERE s.run_id = :r"),
                         {"r": run_id}).all()
        batches = s.execute(text("SELECT count(*) FROM batches WHERE run_id = :r"), {"r": run_id}).scalar_one()
        keys = [r[0] for r in s.execute(text(
            "SELECT output_key FROM batches WHERE run_id = :r AND status = 'done' ORDER BY seq"), {"r": run_id})]
    ledger_ids = Counter(r.sample_id for r in rows)
    status = {r.sample_id: r.status for r in rows}
    in_dead = {r.sample_id for r in rows if r.status == "pending" and r.batch_status == "dead"}
    store = ObjectStore()
    # A sample's canonical row is the one in the shard its ledger row points to.
    out_ids: Counter[str] = Counter()
    by_key: dict[str, set[str]] = {}
    for r in rows:
        if r.output_key:
            by_key.setdefault(r.output_key, set()).add(r.sample_id)
    for key in keys:
        for row in decode_shard(store.get(key)):
            if row["sample_id"] in by_key.get(key, set()):
                out_ids[row["sample_id"]] += 1
    done = sum(1 for i in expected_ids if status.get(i) == "done" and out_ids[i] == 1)
    failed = sum(1 for i in expected_ids if status.get(i) == "failed")
    dead = sum(1 for i in expected_ids if i in in_dead)
    lost = sum(1 for i in expected_ids if (status.get(i) not in ("done", "failed") and i not in in_dead) or
               (status.get(i) == "done" and out_ids[i] == 0))
    return FaultRow(fault="", batches=batches, expected=len(expected_ids), done=done, failed=failed, dead=dead,
                    lost=lost,
                    dup_ledger=sum(n - 1 for n in ledger_ids.values() if n > 1),
                    dup_outputs=sum(n - 1 for n in out_ids.values() if n > 1))


@pytest.fixture
def fault_report():
    def record(fault: str, row: FaultRow) -> FaultRow:
        row.fault = fault
        _ROWS.append(row)
        return row
    return record


def render_table(rows: list[FaultRow]) -> str:
    head = ("fault", "batches", "expected", "done", "failed", "in dead batch", "lost", "dup ledger", "dup outputs")
    body = [(r.fault, r.batches, r.expected, r.done, r.failed, r.dead, r.lost, r.dup_ledger, r.dup_outputs)
            for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(b) for b in body)])


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    table = render_table(_ROWS)
    terminalreporter.write_sep("=", "fault injection: every sample done, failed or in a dead batch exactly once; none lost")
    terminalreporter.write_line(table)
    Path("fault-report.txt").write_text(table + "\n")
