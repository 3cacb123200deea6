"""The run record: one shape for a row of ``runs``, read one way, and one error for a missing run.

Commands and workers read a run by name or id here and get a frozen ``RunRecord``;
only creating a run and changing its status go through the ORM and
ledger/transitions.py. A name that matches no run raises ``RunNotFound`` (a
``ConfigError``: the command line named it, see ledger/errors.py), which the CLI reports
like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ledger.errors import RunNotFound
from ledger.reads import fetch_dicts

if TYPE_CHECKING:
    from ledger.quality import Thresholds

_COLUMNS = ("id, name, model, sampling, config_hash, output_url, queue, batch_size, status, status_reason, "
            "provenance, quality_thresholds, created_at, benchmark")


@dataclass(frozen=True)
class RunRecord:
    """A row of ``runs`` (docs/ledger.md describes each column)."""

    id: int
    name: str
    model: str
    sampling: dict
    config_hash: str
    output_url: str
    queue: str
    batch_size: int
    status: str
    status_reason: str | None
    provenance: dict
    #: The stored overrides of the quality gate (None: the defaults); ``thresholds`` is what they make.
    quality_thresholds: dict | None
    created_at: datetime | None
    #: Submitted with ``regen submit --benchmark``: a fake engine may serve it (worker/engine/fake.py).
    benchmark: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Any) -> RunRecord:
        """From a mapping of the columns (a SQL row's ``_mapping``, a dict) or an ORM ``Run``."""
        get = row.get if isinstance(row, Mapping) else lambda key: getattr(row, key)
        return cls(id=get("id"), name=get("name"), model=get("model"), sampling=get("sampling") or {},
                   config_hash=get("config_hash"), output_url=get("output_url"), queue=get("queue"),
                   batch_size=get("batch_size"), status=get("status"), status_reason=get("status_reason"),
                   provenance=get("provenance") or {}, quality_thresholds=get("quality_thresholds"),
                   created_at=get("created_at"), benchmark=bool(get("benchmark")))

    @cached_property
    def thresholds(self) -> Thresholds:
        """Read once per record: report and export classify every row with it."""
        # Imported here: ledger.quality pulls in SQLAlchemy and the ORM models, which
        # `regen status` (a reader of runs that never classifies) does without.
        from ledger.quality import Thresholds

        return Thresholds.from_json(self.quality_thresholds)

    def for_worker(self) -> dict:
        """What a worker's batch needs of its run, as the dict the batch path takes (worker/batches/delivery.py)."""
        return {"id": self.id, "name": self.name, "model": self.model, "sampling": self.sampling,
                "output_url": self.output_url, "provenance": self.provenance, "config_hash": self.config_hash,
                "quality_thresholds": self.quality_thresholds, "benchmark": self.benchmark}


def find_run(session: Any, name: str, *, for_update: bool = False) -> RunRecord:
    """The run called ``name``; ``for_update`` also takes its row lock (as commits do).

    ``session``, here and below: a SQLAlchemy Session or Connection, or a psycopg
    connection (ledger/reads.py).

    Raises:
        RunNotFound: no run has this name.
    """
    lock = " FOR UPDATE" if for_update else ""
    rows = fetch_dicts(session, f"SELECT {_COLUMNS} FROM runs WHERE name = %(name)s{lock}", {"name": name})
    if not rows:
        raise RunNotFound(name)
    return RunRecord.from_row(rows[0])


def list_runs(session: Any, name: str | None = None) -> list[RunRecord]:
    """Every run, oldest first, or only the one called ``name`` (an empty list if there is none)."""
    where, params = ("WHERE name = %(name)s", {"name": name}) if name is not None else ("", {})
    return [RunRecord.from_row(row)
            for row in fetch_dicts(session, f"SELECT {_COLUMNS} FROM runs {where} ORDER BY id", params)]


def get_run(session: Any, run_id: int) -> RunRecord | None:
    """The run with this id, or None (deleted by ``regen clean --ledger``)."""
    rows = fetch_dicts(session, f"SELECT {_COLUMNS} FROM runs WHERE id = %(id)s", {"id": run_id})
    return RunRecord.from_row(rows[0]) if rows else None


def run_of_batch(session: Any, batch_id: int) -> tuple[str, RunRecord, Any] | None:
    """The batch's status, its run and where its input shard is (a ``shards.InputSlice``); None when
    there is no such batch."""
    rows = fetch_dicts(session,
        f"SELECT b.status AS batch_status, b.input_key, b.input_offset, b.input_length, b.input_sha256, "
        f"{', '.join('r.' + c.strip() for c in _COLUMNS.split(','))} "
        "FROM batches b JOIN runs r ON r.id = b.run_id WHERE b.id = %(batch)s", {"batch": batch_id})
    if not rows:
        return None
    # Imported here: shards imports boto3 and zstandard, which the status path (list_runs) does without.
    from ledger.shards import InputSlice

    row = rows[0]
    where = InputSlice(row["input_key"], row["input_offset"], row["input_length"], row["input_sha256"])
    return row["batch_status"], RunRecord.from_row(row), where
