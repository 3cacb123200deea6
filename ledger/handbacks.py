"""Hand-backs the ledger did not hear of: recorded in Redis, so that their lease's expiry costs no failure.

A worker hands a batch back (SIGTERM, preemption, a paused run, another model's batch) by
releasing it in the ledger: ``queued``, no failure counted. When the ledger cannot be reached
for the whole of the hand-back's time (a network partition between the worker and Postgres,
a Postgres failover), the release never lands: the batch stays ``running`` under the attempt
until its lease expires, and an expiry counts a failure (three make a batch dead), because
from the ledger's side a worker that stopped heartbeating cannot be told from a node that
died with the batch, perhaps killed by it (issue 36).

So the worker says so where it can still write: in Redis, the broker that its hand-back's
message goes back to anyway. ``record_hand_back`` sets ``regen:handback:<batch>:<attempt>``
to the worker's name, with a TTL of a day. The key is the attempt's claim stamp as far as an
expiry needs one: ``attempts`` is the fencing token, so no two committed claims of a batch
share it, and the worker's name (``batches.worker``, written by the claim) is compared too.
The code that expires leases (``expire_leases`` below: the reconciler's pass and ``regen
requeue``) reads the records of the leases it is about to expire, in the same statement's
candidates, and expires a recorded one as a hand-back: ``queued``, ``failures`` unchanged, its
``error`` saying so, and a log line.

Why it cannot excuse a batch that was really lost: a record is written only by the worker's
hand-back path, after the attempt has stopped working on the batch (its task thread gave it
up; nothing of it commits later). A worker that is SIGKILLed, OOM-killed or loses its node
while running the batch writes none, and its lease's expiry counts the failure as before.
A worker that is SIGKILLed *during* a shutdown's hand-back wrote its records first (the
shutdown path records before it releases): those attempts had stopped already, and were not
what killed it (the reaper's SIGKILL, at the end of its grace, was).

What it does not cover: a Redis that is down or flushed as well (no record to read: the
expiry counts the failure; and a pass that cannot read the records expires nothing until it
can, a broker that is down delivering nothing either), and an outage of the ledger longer
than ``RECORD_TTL_S``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from ledger import transitions

log = logging.getLogger(__name__)

#: One key per hand-back whose release may not have landed: its value is the worker's name.
KEY = "regen:handback:{batch}:{attempt}"
#: How long a record is kept: far beyond the lease (30 s) and the reconciler's interval (10 s),
#: so a lease that expires only when a long ledger outage ends is still excused. A record is a
#: few dozen bytes, and one is written per hand-back at a shutdown or per release that gave up.
RECORD_TTL_S = 24 * 60 * 60


def _key(batch_id: int, attempt: int) -> str:
    return KEY.format(batch=batch_id, attempt=attempt)


def record_hand_back(client: Any, batch_id: int, attempt: int, *, worker: str, ttl_s: float = RECORD_TTL_S) -> None:
    """Record that ``worker`` handed the batch's ``attempt`` back (redis-py client; raises its errors)."""
    record_hand_backs(client, {batch_id: attempt}, worker=worker, ttl_s=ttl_s)


def record_hand_backs(client: Any, attempts: dict[int, int] | Iterable[tuple[int, int]], *, worker: str,
                      ttl_s: float = RECORD_TTL_S) -> None:
    """``record_hand_back`` for each ``{batch id: attempt}`` or (batch id, attempt), in one round trip (a closing
    worker's leftovers; pairs, where one process holds two attempts of a batch)."""
    pipe = client.pipeline(transaction=False)
    for batch_id, attempt in (attempts.items() if isinstance(attempts, dict) else attempts):
        pipe.set(_key(batch_id, attempt), worker, ex=max(1, int(ttl_s)))
    pipe.execute()


def forget_hand_back(client: Any, batch_id: int, attempt: int) -> None:
    """The release landed: the record is not needed (it would match no running attempt anyway)."""
    client.delete(_key(batch_id, attempt))


def recorded_hand_backs(client: Any, leases: Sequence[Any]) -> set[int]:
    """Of ``leases`` (rows with ``id``, ``attempts``, ``worker``), the batch ids whose attempt was handed back."""
    if not leases:
        return set()
    values = client.mget([_key(r.id, r.attempts) for r in leases])
    found = set()
    for lease, value in zip(leases, values, strict=True):
        if value is not None and (value.decode() if isinstance(value, bytes) else value) == lease.worker:
            found.add(lease.id)
    return found


def expire_leases(session: Session, client: Any, *, lease_s: float, max_attempts: int,
                  run: str | None = None) -> list:
    """Expire the leases not renewed for ``lease_s``: a failure each, except recorded hand-backs.

    Rows of ``(id, status, handed_back)``. Raises the broker's error if the records cannot be
    read, before anything is expired: the caller expires nothing this time rather than count a
    failure for a hand-back it could not see.
    """
    leases = transitions.expiring_leases(session, lease_s=lease_s, run=run)
    if not leases:
        return []
    handed_back = recorded_hand_backs(client, leases)
    rows = transitions.expire_leases(session, [(r.id, r.attempts, r.id in handed_back) for r in leases],
                                     lease_s=lease_s, max_attempts=max_attempts)
    excused = [r.id for r in rows if r.handed_back]
    if excused:
        by_id = {r.id: r for r in leases}
        log.warning("%d expired leases were hand-backs whose release never reached the ledger: queued with no "
                    "failure counted (batch ids and workers %s%s)", len(excused),
                    [(b, by_id[b].worker) for b in excused[:10]], "..." if len(excused) > 10 else "")
    return rows
