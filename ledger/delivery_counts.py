"""Counters of deliveries that did no work: writes to ``batches`` that leave its status alone.

Kept apart from ledger/transitions.py, which holds every status write (tests/unit/test_transitions.py
checks that no other module writes one): these only count what a delivery was, for ``regen status``,
``regen metrics`` and the reconciler's decisions.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

# The batch stays queued, its wait restarts and the new message is counted (reconciler: a lost message).
_MARK_LOST = text("""
UPDATE batches SET enqueued_at = now(), republishes = republishes + 1 WHERE id = ANY(:ids) AND status = 'queued'
RETURNING id""")
# A delivery acknowledged without work (docs/ledger.md: stale_deliveries).
_COUNT_STALE = text("UPDATE batches SET stale_deliveries = stale_deliveries + 1 WHERE id = :batch")
# A fake engine's delivery of a real run's batch, handed back untouched and counted.
_COUNT_FAKE_REFUSAL = text("UPDATE batches SET fake_refusals = fake_refusals + 1 WHERE id = :batch")


def mark_message_lost(session: Session, batch_ids: list[int]) -> set[int]:
    """Queued batches whose message was neither on the queue nor claimed: the ids still queued."""
    return {r[0] for r in session.execute(_MARK_LOST, {"ids": batch_ids})}


def count_stale_delivery(session: Session, batch_id: int) -> None:
    """A message of a batch that was done, dead or held by another live attempt: counted, not worked."""
    session.execute(_COUNT_STALE, {"batch": batch_id})


def count_fake_refusal(session: Session, batch_id: int) -> None:
    """A fake-engine worker was handed a batch of a run not submitted with ``--benchmark``: counted, not worked."""
    session.execute(_COUNT_FAKE_REFUSAL, {"batch": batch_id})
