"""``regen clean --run NAME``: delete a run's objects (its whole S3 prefix) and, if asked, its ledger rows.

Deleting is the one thing regen cannot undo, so the command shows what it would
delete unless ``--yes`` is given, and refuses outright when:

* another run's output lies inside this run's prefix, or this run's inside another's
  (deleting the prefix would take the other run's shards with it);
* the run still has batches waiting or running (workers would fail on the missing
  input shards), unless ``--force``: pause the run or let it finish first.

Objects go first, ledger rows second: if the deletion of objects fails half way,
the run is still in the ledger and the same command finishes the job.

The overlap rule is also submit's: a new run on a prefix that overlaps another run's is
refused (``refuse_a_shared_prefix``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from ledger.errors import ConfigError
from ledger.objects import ObjectStore, parse_s3_url
from ledger.runs import find_run


@dataclass(frozen=True)
class CleanPlan:
    run: str
    run_id: int
    status: str
    output_url: str
    objects: int
    batches: int
    samples: int
    rejected_rows: int
    #: Batches planned, queued or running: a worker may still read or write the prefix.
    busy_batches: int
    #: Other runs whose output overlaps this run's prefix ("name (url)"): cleaning is refused.
    overlaps: tuple[str, ...] = ()


@dataclass(frozen=True)
class CleanReport:
    objects_deleted: int
    ledger_deleted: bool


def _folder(url: str) -> str:
    """``s3://bucket/a/b`` → ``s3://bucket/a/b/``: prefixes compared as folders (``run1`` is not ``run10``)."""
    bucket, key = parse_s3_url(url)
    key = key.strip("/")
    return f"s3://{bucket}/{key}/" if key else f"s3://{bucket}/"


def overlapping_runs(session: Session, run_id: int, output_url: str) -> list[str]:
    """Other runs whose output folder contains this run's, or lies inside it."""
    mine = _folder(output_url)
    clashes = []
    for name, url in session.execute(text("SELECT name, output_url FROM runs WHERE id <> :id ORDER BY name"),
                                     {"id": run_id}):
        try:
            theirs = _folder(url)
        except ConfigError:
            # Another run's URL we cannot parse: compare it as written rather than refuse every clean.
            theirs = url.rstrip("/") + "/"
        if theirs.startswith(mine) or mine.startswith(theirs):
            clashes.append(f"{name} ({url})")
    return clashes


def refuse_a_shared_prefix(session: Session, name: str, output_url: str) -> None:
    """Refuse a new run ``name`` whose output prefix is another run's, inside it or around it.

    Shards are named by batch number alone, so such a run would find the other run's shards at its
    keys and commit them as its own (issue 58; a worker checks a found shard's rows too,
    ledger/output_check.py).

    Raises:
        ConfigError: one line naming the other run and what to do.
    """
    # Two submits creating runs on one prefix at once would both pass the check: one advisory lock
    # serialises the creations, held to the end of the caller's transaction (the run's INSERT).
    session.execute(text("SELECT pg_advisory_xact_lock(8151, 0)"))
    clashes = overlapping_runs(session, 0, output_url)
    if clashes:
        more = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
        raise ConfigError(f"--output {output_url} overlaps the output of run {clashes[0]}{more}: a run's shards "
                          f"would be taken as this one's; give run {name!r} an --output prefix of its own")


def plan_clean(sessions: sessionmaker[Session], store: ObjectStore, run_name: str) -> CleanPlan:
    """What ``clean_run`` would delete. Raises ConfigError for an unknown run."""
    with sessions() as s:
        run = find_run(s, run_name)
        batches, busy = s.execute(text(
            "SELECT count(*), count(*) FILTER (WHERE status IN ('planned', 'queued', 'running')) FROM batches "
            "WHERE run_id = :id"), {"id": run.id}).one()
        samples = s.scalar(text("SELECT count(*) FROM samples WHERE run_id = :id"), {"id": run.id})
        rejected = s.scalar(text("SELECT count(*) FROM rejected_rows WHERE run_id = :id"), {"id": run.id})
        overlaps = tuple(overlapping_runs(s, run.id, run.output_url))
    objects = sum(1 for _ in store.list(_folder(run.output_url)))
    return CleanPlan(run=run_name, run_id=run.id, status=run.status, output_url=run.output_url,
                     objects=objects, batches=int(batches), samples=int(samples), rejected_rows=int(rejected),
                     busy_batches=int(busy), overlaps=overlaps)


def clean_run(sessions: sessionmaker[Session], store: ObjectStore, run_name: str, *, delete_ledger: bool,
              force: bool = False) -> CleanReport:
    """Delete every object under the run's output URL, then (``delete_ledger``) the run and all its rows.

    Raises:
        ConfigError: no such run, its prefix overlaps another run's, or it still has
            batches waiting or running and ``force`` is not set.
        StoreError: the object store refused a deletion (nothing is removed from the ledger then).
    """
    plan = plan_clean(sessions, store, run_name)
    if plan.overlaps:
        raise ConfigError(f"run {run_name!r} writes to {plan.output_url}, which overlaps the output of "
                          f"{', '.join(plan.overlaps)}; deleting it would delete their shards too. Delete by hand.")
    if plan.busy_batches and not force:
        raise ConfigError(f"run {run_name!r} still has {plan.busy_batches} batches waiting or running; "
                          "pause it (or let it finish) first, or pass --force")
    deleted = store.delete_prefix(_folder(plan.output_url))
    with sessions.begin() as s:
        if delete_ledger:
            # ON DELETE CASCADE takes batches, samples and rejected_rows with the run.
            s.execute(text("DELETE FROM runs WHERE id = :id"), {"id": plan.run_id})
        else:
            when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            s.execute(text("UPDATE runs SET status_reason = :why WHERE id = :id"),
                      {"id": plan.run_id, "why": f"objects deleted by regen clean on {when} ({deleted} objects)"})
    return CleanReport(objects_deleted=deleted, ledger_deleted=delete_ledger)


def describe_plan(plan: CleanPlan, *, delete_ledger: bool) -> str:
    lines = [f"run {plan.run} [{plan.status}]: {plan.objects:,} objects under {_folder(plan.output_url)}"]
    if delete_ledger:
        lines.append(f"  and its ledger rows: 1 run, {plan.batches:,} batches, {plan.samples:,} samples, "
                     f"{plan.rejected_rows:,} rejected rows")
    else:
        lines.append("  ledger rows kept (add --ledger to delete them too)")
    if plan.overlaps:
        lines.append(f"  refused: the prefix overlaps the output of {', '.join(plan.overlaps)}")
    if plan.busy_batches:
        lines.append(f"  refused without --force: {plan.busy_batches:,} batches are still waiting or running")
    return "\n".join(lines)
