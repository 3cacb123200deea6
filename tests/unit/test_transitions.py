"""Every status write is a declared transition, and lives in ledger/transitions.py.

Two halves: each statement of the transitions module is checked against the tables of
ledger/states.py (what its SQL sets and guards must be what it declares, and what it
declares must be allowed); and every other module of the packages, the benches and the
scripts is searched for a status write (SQL that sets or inserts a status, an ORM
assignment), which must not exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ledger import states, transitions
from ledger.states import (
    BATCH_INITIAL,
    BATCH_TRANSITIONS,
    RUN_INITIAL,
    RUN_TRANSITIONS,
    SAMPLE_INITIAL,
    SAMPLE_TRANSITIONS,
    BatchStatus,
    IllegalTransition,
    RunStatus,
    SampleStatus,
    check_transition,
)

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("ledger", "producer", "worker", "bench", "scripts")
HOME = ROOT / "ledger" / "transitions.py"
#: Modules that build synthetic ledgers in SQL (a 100M-sample run's batches at 50% done; the farm bench's
#: ledger-only run of queued batches; the export bench's finished run), never a live one.
SYNTHETIC = {ROOT / "bench" / "ledger_commits.py", ROOT / "bench" / "farm_ledger.py",
             ROOT / "bench" / "export_scale.py"}

TABLES = {
    "runs": (RunStatus, RUN_TRANSITIONS, RUN_INITIAL),
    "batches": (BatchStatus, BATCH_TRANSITIONS, BATCH_INITIAL),
    "samples": (SampleStatus, SAMPLE_TRANSITIONS, SAMPLE_INITIAL),
}
STATUS_TABLES = "|".join(TABLES)

_UPDATE = re.compile(rf"\bUPDATE\s+({STATUS_TABLES})\b(?:\s+(\w+))?\s+SET\b(.*?)(?=\bFROM\b|\bWHERE\b|\bRETURNING\b|$)",
                     re.I | re.S)
_INSERT = re.compile(rf"\b(?:INSERT\s+INTO|COPY)\s+({STATUS_TABLES})\s*\(([^)]*)\)", re.I)
_LITERAL = re.compile(r"'(\w+)'")


def _sets_status(set_list: str, alias: str | None) -> str | None:
    """The expression assigned to ``status`` in an UPDATE's SET list, if any."""
    prefix = rf"(?:{alias}\.)?" if alias else ""
    match = re.search(rf"(?<![\w.]){prefix}status\s*=\s*(CASE\b.*?(?:\bEND\b|$)|'\w+'|:\w+|v\.\w+)", set_list, re.I | re.S)
    return match.group(1) if match else None


def _where_guards(sql: str, alias: str | None) -> set[str]:
    """Statuses the WHERE clause requires of the updated row (``status = 'x'``, ``status IN (...)``)."""
    where = re.split(r"\bWHERE\b", sql, maxsplit=1, flags=re.I)
    if len(where) == 1:
        return set()
    clause = re.sub(r"\(\s*SELECT\b[^()]*(?:\([^()]*\)[^()]*)*\)", "", where[1], flags=re.I | re.S)  # subqueries
    column = rf"(?<![\w.])(?:{alias}\.)?status" if alias else r"(?<![\w.])status"
    found: set[str] = set()
    for m in re.finditer(rf"{column}\s*(?:=\s*'(\w+)'|IN\s*\(([^)]*)\))", clause, re.I):
        found |= {m.group(1)} if m.group(1) else set(_LITERAL.findall(m.group(2)))
    return found


@pytest.mark.parametrize("t", transitions.TRANSITIONS, ids=lambda t: f"{t.table}:{sorted(t.source)}->{sorted(t.target)}")
def test_each_status_write_of_the_transitions_module_is_a_declared_transition(t):
    enum, table, initial = TABLES[t.table]
    if not t.source:
        assert {enum(s) for s in t.target} <= initial, f"a new {t.table} row cannot start in {sorted(t.target)}"
    for old in t.source:
        for new in t.target:
            check_transition(table, enum(old), enum(new))
    update = _UPDATE.search(t.sql)
    if update is None:
        return
    assert update.group(1) == t.table
    alias = update.group(2) if update.group(2) and update.group(2).upper() != "SET" else None
    value = _sets_status(update.group(3), alias)
    assert value is not None, f"registered as a status write but sets no status: {t.sql}"
    written = set(_LITERAL.findall(value))
    if written:  # a bound parameter or a value row's column (record_samples) is checked by the function at run time
        assert written == set(t.target), f"sets {sorted(written)}, declares {sorted(t.target)}"
    guards = _where_guards(t.sql, alias)
    if guards:
        assert guards == set(t.source), f"guards on {sorted(guards)}, declares {sorted(t.source)}"


def test_the_declared_tables_name_every_status_and_reject_what_is_not_declared():
    for enum, table, initial in TABLES.values():
        assert set(table) == set(enum)
        assert initial <= set(enum)
    with pytest.raises(IllegalTransition):
        check_transition(BATCH_TRANSITIONS, BatchStatus.DONE, BatchStatus.QUEUED)
    with pytest.raises(IllegalTransition):
        check_transition(RUN_TRANSITIONS, RunStatus.FINISHED, RunStatus.PAUSED)


def test_the_checker_sees_the_statement_shapes_it_must_refuse_elsewhere():
    assert _sets_status(" status = 'queued', enqueued_at = now() ", None) == "'queued'"
    assert _sets_status(" status_reason = :why ", None) is None
    assert _sets_status(" failures = b.failures + 1, status = CASE WHEN x THEN 'dead' ELSE 'queued' END ", "b")
    assert _where_guards("UPDATE runs SET status = 'finished' WHERE id = :run AND status = 'active' AND NOT EXISTS "
                         "(SELECT 1 FROM batches WHERE run_id = :run AND status NOT IN ('done', 'dead'))",
                         None) == {"active"}
    assert _where_guards("UPDATE batches b SET x = 1 FROM runs r WHERE r.status <> 'paused' AND "
                         "(b.status IN ('planned', 'queued') OR (b.status = 'running'))", "b") \
        == {"planned", "queued", "running"}


def _status_writes(path: Path) -> list[str]:
    """Status writes in one module: SQL in its string constants, ORM assignments in its code."""
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in _UPDATE.finditer(node.value):
                alias = m.group(2) if m.group(2) and m.group(2).upper() != "SET" else None
                if _sets_status(m.group(3), alias):
                    found.append(f"{path.name}:{node.lineno}: UPDATE {m.group(1)} SET status")
            for m in _INSERT.finditer(node.value):
                if re.search(r"(?<![\w.])status\b", m.group(2)):
                    found.append(f"{path.name}:{node.lineno}: INSERT/COPY {m.group(1)} with a status")
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("Run", "Batch", "Sample", "values") and any(
                    k.arg == "status" for k in node.keywords):
                found.append(f"{path.name}:{node.lineno}: {name}(status=...)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
                found.append(f"{path.name}:{node.lineno}: .status = ...")
    return found


def test_no_status_is_written_outside_the_transitions_module():
    offenders = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != HOME and path not in SYNTHETIC:
                offenders += [f"{path.relative_to(ROOT)} {w.split(':', 1)[1]}" for w in _status_writes(path)]
    assert offenders == [], "status writes outside ledger/transitions.py:\n" + "\n".join(offenders)


def test_the_search_finds_the_writes_of_the_transitions_module_itself():
    # The scan above is only worth something if it sees what it is looking for.
    found = _status_writes(HOME)
    assert len(found) >= len([t for t in transitions.TRANSITIONS if "Run(" not in t.sql]), found
    assert states.RunStatus.ACTIVE.value in {s for t in transitions.TRANSITIONS for s in t.target}
