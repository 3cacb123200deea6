"""Whose rows an output shard holds: checked before a batch commits a shard it did not just generate.

A worker that finds an object at its batch's output key (an earlier attempt uploaded it and never
committed, or a twin attempt wrote first) commits that object instead of generating again. The key
is only a name under the run's prefix: another run on the same prefix, or a run cleaned with
``--force`` and submitted again while old workers still upload, may have put it there, and sample
ids are content hashes, so they match across runs of one dataset. The rows must therefore name this
run and its config hash, and hold exactly this batch's samples, or the shard is not committed
(issue 58). ``regen retry --dead`` asks the same question before it replays a batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger.errors import RegenError

#: How many of the foreign sample ids a refusal quotes.
_QUOTED_IDS = 3


class ForeignShard(RegenError):
    """The object at a batch's output key is not that batch's output: never committed."""


def batch_sample_ids(session: Session, batch_id: int) -> set[str]:
    """The samples the ledger places in the batch (index samples_batch_idx)."""
    return set(session.scalars(text("SELECT sample_id FROM samples WHERE batch_id = :b"), {"b": batch_id}))


def foreign_rows_reason(rows: Iterable[dict], *, run_name: str, config_hash: str, sample_ids: set[str]) -> str | None:
    """Why ``rows`` are not the output of the batch whose samples are ``sample_ids``; None if they are.

    A row must carry the run's name (``run``: rows written before it existed carry none, and are
    judged by the rest) and config hash (``provenance.config_hash``), and the rows' sample ids must be
    the batch's, each once.
    """
    runs: Counter[str] = Counter()
    hashes: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for row in rows:
        if row.get("run") is not None and row["run"] != run_name:
            runs[str(row["run"])] += 1
        found_hash = (row.get("provenance") or {}).get("config_hash")
        if found_hash != config_hash:
            hashes[str(found_hash)] += 1
        seen[str(row.get("sample_id"))] += 1
    if runs:
        return f"{sum(runs.values())} rows of run {runs.most_common(1)[0][0]!r}, not {run_name!r}"
    if hashes:
        return (f"{sum(hashes.values())} rows of config hash {hashes.most_common(1)[0][0][:12]}, "
                f"not the run's {config_hash[:12]}")
    strangers = sorted(set(seen) - sample_ids)
    missing = len(sample_ids - set(seen))
    doubled = sum(n - 1 for n in seen.values() if n > 1)
    if strangers or missing or doubled:
        quoted = ", ".join(repr(s[:40]) for s in strangers[:_QUOTED_IDS])
        return (f"its sample ids are not the batch's: {len(strangers)} not in it{f' ({quoted})' if quoted else ''}, "
                f"{missing} of its {len(sample_ids)} missing, {doubled} repeated")
    return None


def refusal(output_key: str, reason: str) -> str:
    """The one line a foreign shard is refused with: what it holds and what to do."""
    return (f"the object at {output_key} is not this batch's output ({reason}): not committed. Another run wrote "
            "under this run's prefix, or it was cleaned and submitted again while old workers still uploaded; "
            "move the object away, then `regen retry --dead`")
