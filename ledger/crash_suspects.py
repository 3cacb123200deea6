"""Samples in flight when an engine died, until the poison among them is found (issue 58, item 4; migration 0014).

An engine death is charged to no batch. Each batch in flight records its conversations that
had started and not ended (``record_crash``); its next attempt's claim returns them (``SUSPECTS_OF_B``):
a suspect runs isolated (at most one isolated sample per engine at a time), and a sample
that was in flight isolated at ``ISOLATED_CRASHES_TO_FAIL`` deaths is failed with reason
``engine_crash`` without running again. Migration 0014 says why this finds a poison within
three engine deaths and condemns no innocent sample.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

#: Isolated deaths that condemn a sample: two, so that a second poison among the fresh samples
#: beside an innocent isolated suspect cannot condemn it alone (migration 0014).
ISOLATED_CRASHES_TO_FAIL = 2
#: The failed sample's reason (``samples.error``'s code, ``regen status``'s failure reasons).
ENGINE_CRASH = "engine_crash"


@dataclass(frozen=True)
class Suspects:
    """What a batch's next attempt does with its samples that were in flight at engine deaths."""

    #: Failed with reason ``engine_crash``, not run: sample id -> the deaths it was in flight at.
    condemned: dict[str, int] = field(default_factory=dict)
    #: Run isolated (one per engine at a time).
    isolate: frozenset[str] = frozenset()


#: The suspects of the batch the enclosing statement calls ``b``, as one JSON array of ``[sample_id,
#: crashes, isolated_crashes]`` (NULL: none). The claim returns it (ledger/transitions.py ``_CLAIM``):
#: read by the claim's own statement, so the attempt runs with the suspects as they were when it took
#: the batch, and no round trip of its own is spent on them.
SUSPECTS_OF_B = """(SELECT json_agg(json_build_array(cs.sample_id, cs.crashes, cs.isolated_crashes))
        FROM engine_crash_suspects cs WHERE cs.batch_id = b.id)"""


def suspects_from(rows: Iterable[Sequence[Any]] | None) -> Suspects:
    """What an attempt does with the rows of ``SUSPECTS_OF_B``: ``(sample_id, crashes, isolated_crashes)`` each."""
    found = [(str(sid), int(crashes), int(isolated)) for sid, crashes, isolated in rows or ()]
    condemned = {sid: crashes for sid, crashes, isolated in found if isolated >= ISOLATED_CRASHES_TO_FAIL}
    return Suspects(condemned=condemned,
                    isolate=frozenset(sid for sid, crashes, _ in found if crashes > 0 and sid not in condemned))


_RECORD = text("""
INSERT INTO engine_crash_suspects AS s (batch_id, sample_id, crashes, isolated_crashes, last_crash_by)
SELECT :b, sid, 1, CASE WHEN sid = ANY(CAST(:isolated AS text[])) THEN 1 ELSE 0 END, :by
FROM unnest(CAST(:sids AS text[])) AS sid
ON CONFLICT (batch_id, sample_id) DO UPDATE
SET crashes = s.crashes + 1, isolated_crashes = s.isolated_crashes + excluded.isolated_crashes,
    last_crash_at = now(), last_crash_by = excluded.last_crash_by""")


def record_crash(session: Session, batch_id: int, in_flight: Collection[str], *, isolated: Collection[str],
                 worker: str) -> None:
    """One engine death: ``in_flight`` (the batch's started, unfinished samples) a crash more each, those
    of them that ran ``isolated`` an isolated crash more."""
    if in_flight:
        session.execute(_RECORD, {"b": batch_id, "sids": sorted(in_flight),
                                  "isolated": sorted(set(isolated) & set(in_flight)), "by": worker})
