"""What a piece of code reads from Postgres: its statements, caught as they run, then re-run under EXPLAIN ANALYZE.

    with caught_statements(engine) as caught:
        collect(settings, db=engine)
    reads = [plan_reads(conn, sql, params) for sql, params in caught]

Rows read per table count what a scan visited, not what it returned: the rows it returned
plus those its filter dropped, over all its loops (EXPLAIN gives per-loop averages, so a
parallel scan's total is rounded: 999,999 for 1,000,000). bench/metrics_scale.py prints them for
each side, and tests/integration/test_metrics_bounds.py holds the exporter's to a bound.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

#: Plan nodes that visit a table's rows (a Bitmap Index Scan only marks them: its Heap Scan reads).
_ROW_SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan")


@dataclass
class PlanReads:
    """One statement's plan: its time, its shared buffers, and the rows each table gave up."""

    sql: str
    execution_ms: float
    #: Shared buffers hit or read, the whole plan (the top node's count includes its children's).
    buffers: int
    #: table -> rows visited (returned + dropped by a filter or recheck), over every loop
    rows: dict[str, float] = field(default_factory=dict)
    #: "Seq Scan batches", "Index Only Scan batches_failures_idx", ... in plan order
    scans: list[str] = field(default_factory=list)


@contextlib.contextmanager
def caught_statements(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    """The SELECTs run on ``engine`` inside the block, as ``(sql, parameters)`` the driver got them."""
    caught: list[tuple[str, Any]] = []

    def catch(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "pg_advisory" not in statement:
            caught.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", catch)
    try:
        yield caught
    finally:
        event.remove(engine, "before_cursor_execute", catch)


def plan_reads(dbapi_conn, sql: str, params: Any = None) -> PlanReads:
    """Run ``sql`` under EXPLAIN (ANALYZE, BUFFERS) on a psycopg connection; what its plan read."""
    with dbapi_conn.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        raw = cur.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    top = plan["Plan"]
    reads = PlanReads(sql=sql, execution_ms=float(plan["Execution Time"]),
                      buffers=int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)))
    _walk(top, reads)
    return reads


def plans_of(dbapi_conn, statements: list[tuple[str, Any]]) -> tuple[list[PlanReads], dict[str, float]]:
    """Each caught statement's plan, and the rows each table gave up over all of them."""
    plans = [plan_reads(dbapi_conn, sql, params) for sql, params in statements]
    rows: dict[str, float] = {}
    for reads in plans:
        for table, n in reads.rows.items():
            rows[table] = rows.get(table, 0.0) + n
    return plans, rows


def _walk(node: dict, reads: PlanReads) -> None:
    if node["Node Type"] in _ROW_SCANS and "Relation Name" in node:
        table = node["Relation Name"]
        loops = float(node.get("Actual Loops", 1))
        visited = (float(node.get("Actual Rows", 0)) + float(node.get("Rows Removed by Filter", 0))
                   + float(node.get("Rows Removed by Index Recheck", 0))) * loops
        reads.rows[table] = reads.rows.get(table, 0.0) + visited
        reads.scans.append(f"{node['Node Type']} {node.get('Index Name') or table}")
    for child in node.get("Plans", []):
        _walk(child, reads)
