"""Rejected rows where the user looks: ``file:row reason detail`` lines, for submit and ``regen status --rejected``.

The ledger keeps every rejected row (``rejected_rows``); counts alone ("malformed_json: 1") send
the user to psql to find which row and why. Both commands print the same line per row, the file
shown relative to the current folder when it lies under it (the ledger holds the resolved path).
"""

from __future__ import annotations

import os
from typing import Any

from ledger.reads import fetch_dicts

#: Rows ``regen status --rejected`` lists unless ``--limit`` says otherwise: enough to see the pattern.
DEFAULT_LIST_LIMIT = 100

_LIST = ("SELECT r.name AS run, x.source_file AS file, x.source_row AS row, x.reason, x.detail "
         "FROM rejected_rows x JOIN runs r ON r.id = x.run_id "
         "WHERE (%(run)s::text IS NULL OR r.name = %(run)s) AND (%(reason)s::text IS NULL OR x.reason = %(reason)s) "
         "ORDER BY r.id, x.source_file, x.source_row LIMIT %(limit)s")
_COUNT = ("SELECT count(*) AS n FROM rejected_rows x JOIN runs r ON r.id = x.run_id "
          "WHERE (%(run)s::text IS NULL OR r.name = %(run)s) AND (%(reason)s::text IS NULL OR x.reason = %(reason)s)")


def shown_path(file: str) -> str:
    """``file`` relative to the current folder when it lies under it, else as stored."""
    try:
        rel = os.path.relpath(file)
    except ValueError:  # another drive (Windows)
        return file
    return file if rel.startswith("..") else rel


def reject_line(row: dict[str, Any]) -> str:
    """``file:row reason detail``, the detail on one line (a path in it, a duplicate's first row's, shown alike)."""
    detail = " ".join(str(row.get("detail") or "").split()).replace(os.getcwd() + os.sep, "")
    return f"{shown_path(row['file'])}:{row['row']} {row['reason']} {detail}".rstrip()


def list_rejected(conn: Any, run: str | None, reason: str | None, limit: int) -> tuple[list[dict], int]:
    """The first ``limit`` rejected rows (of one run and reason, if given) and how many there are in all."""
    params = {"run": run, "reason": reason, "limit": limit}
    rows = fetch_dicts(conn, _LIST, params)
    total = fetch_dicts(conn, _COUNT, params)[0]["n"]
    return rows, total


def render_rejected(rows: list[dict], total: int, *, several_runs: bool) -> str:
    """The listing ``regen status --rejected`` prints."""
    if not total:
        return "no rejected rows"
    lines = [(f"{r['run']}  " if several_runs else "") + reject_line(r) for r in rows]
    if total > len(rows):
        lines.append(f"... and {total - len(rows):,} more (--limit N shows more; --reason R one reason)")
    return "\n".join(lines)


def rejected_text(settings: Any, run: str | None, reason: str | None, limit: int, *, as_json: bool) -> str:
    """What ``regen status --rejected [--run R] [--reason X] [--json]`` prints."""
    import json

    from ledger.reads import connect

    with connect(settings) as conn:
        rows, total = list_rejected(conn, run, reason, limit)
    if as_json:
        return json.dumps({"rejected": rows, "total": total}, indent=2, default=str)
    return render_rejected(rows, total, several_runs=run is None)


def first_rejects_lines(report: Any) -> list[str]:
    """What submit prints of its rejected rows: the first few (``SubmitReport.first_rejects``) and how many more."""
    if not report.first_rejects:
        return []
    total = report.rejected + report.duplicates
    lines = [f"rejected rows (file:row reason detail; `regen status --run {report.run} --rejected` lists them all):"]
    lines += ["  " + reject_line(row) for row in report.first_rejects]
    if total > len(report.first_rejects):
        lines.append(f"  ... and {total - len(report.first_rejects):,} more")
    return lines
