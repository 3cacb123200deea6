"""``regen status``: per run, where every sample is, why rows were rejected, how fast it goes.

Every figure reads counters or a bounded slice, so a status costs the same on a 100M-sample
run as on a small one (bench/reconcile_scale.py: 52-58 ms): samples by status and class from
the trigger-kept ``run_sample_counts`` (migration 0005); batches, tokens and the projection from
``run_batch_counts`` (migration 0011; both sharded by batch, summed here); throughput from the last RECENT_BATCHES done; failure
reasons from at most FAILED_REASONS_READ failed samples; the queue from its head. What grows is
what the farm holds: the running batches (workers, in flight), ~50 ms at 122,000.

The queries run on a plain psycopg connection (what ``regen status`` opens: no
SQLAlchemy import, ~0.2 s of a short command) or on a SQLAlchemy Session or Connection
(the exporter, ``--watch``, tests), through ledger/reads.py. ``conn`` below is either.
"""

from __future__ import annotations

from typing import Any

from ledger.defaults import QUEUED_GRACE_S
from ledger.reads import fetch_dicts, fetch_rows
from ledger.runs import list_runs
from ledger.states import REFUSED_PREFIX, BatchStatus, Quality, SampleStatus

#: Window for "recent throughput": long enough to smooth over hour-long batches
#: finishing one at a time on a few nodes, short enough to notice a slowdown.
RECENT_WINDOW_S = 15 * 60
#: ... or the last this many batches done, if fewer seconds hold them: a big farm's 15 minutes
#: are ~94K batches, whose read took ~0.4 s; 2,000 are ~20 s of its commits, 128K samples.
RECENT_BATCHES = 2000
#: Failed samples whose reasons are counted (each a random read of ``samples``); beyond it the
#: reasons are those of the first ones read, and ``samples.failed`` is still the exact total.
FAILED_REASONS_READ = 2000


_SAMPLE_COUNTS = "SELECT status, sum(n) FROM run_sample_counts WHERE run_id = %(run)s GROUP BY status"
_QUALITY_COUNTS = ("SELECT quality, sum(n) FROM run_sample_counts WHERE run_id = %(run)s AND quality <> '' "
                   "GROUP BY quality")


def sample_counts(conn, run_id: int) -> tuple[dict[str, int], dict[str, int]]:
    """``(by status, by quality class)`` of a run's samples, from the trigger-kept ``run_sample_counts``
    (migration 0005): a few rows, whatever the run's size."""
    by_status = {s.value: 0 for s in SampleStatus}
    by_status.update(_counts(conn, _SAMPLE_COUNTS, run_id))
    quality = _counts(conn, _QUALITY_COUNTS, run_id)
    # Worst class first (ledger/quality.py's order).
    return by_status, {q.value: quality[q.value] for q in Quality if quality.get(q.value)}


def _counts(conn: Any, sql: str, run_id: int, **params: Any) -> dict[str, int]:
    return {row[0]: int(row[1]) for row in fetch_rows(conn, sql, {"run": run_id, **params})}


#: Queued batches looked up on the broker at most: as many as a reconciler pass examines.
BROKER_CHECK_LIMIT = 2000


_REDELIVERED = ("SELECT coalesce(sum(stale_deliveries), 0), coalesce(sum(republishes), 0) FROM batches "
                "WHERE run_id = %(run)s AND (stale_deliveries > 0 OR republishes > 0)")
#: Batches a fake engine made or refused (migration 0010's partial index: only those batches).
_FAKE = ("SELECT count(*) FILTER (WHERE fake), coalesce(sum(fake_refusals), 0) FROM batches "
         "WHERE run_id = %(run)s AND (fake OR fake_refusals > 0)")
_OLDEST_QUEUED = ("SELECT id, enqueued_at, now() - make_interval(secs => %(grace)s) FROM batches "
                  "WHERE run_id = %(run)s AND status = 'queued' AND enqueued_at IS NOT NULL "
                  "ORDER BY enqueued_at LIMIT %(n)s")


def broker_figures(conn: Any, run_id: int, queue: str, broker_url: str | None, *,
                   grace_s: float = QUEUED_GRACE_S) -> dict:
    """Messages of a run that the ledger counts: stale deliveries, republished ones, and queued batches
    with no message waiting on the queue ``grace_s`` after their last one (a stall, if nothing republishes them).

    Each query reads a partial index (migration 0007): the few batches with a second message,
    the run's oldest queued batches. Redis is asked only when the oldest is past the grace
    period (redis-py is imported then only), and only its head is read, as the reconciler
    does (ledger/broker.py ``missing_messages``): the figure covers the ``BROKER_CHECK_LIMIT``
    oldest queued batches, where a lost message is. ``queued_without_message`` is None when it
    cannot be told (no broker URL, the broker unreachable, or a head crowded with other messages).
    """
    ((stale, republishes),) = fetch_rows(conn, _REDELIVERED, {"run": run_id})
    rows = fetch_rows(conn, _OLDEST_QUEUED, {"run": run_id, "grace": grace_s, "n": BROKER_CHECK_LIMIT})
    without: int | None = 0
    if rows and rows[0][1] < rows[0][2]:
        without = None
        if broker_url is not None:
            without = _count_missing(conn, broker_url, queue, rows)
    return {"stale_deliveries": int(stale), "republishes": int(republishes), "queued_without_message": without,
            "grace_s": grace_s}


def _count_missing(conn: Any, broker_url: str, queue: str, rows: list) -> int | None:
    import redis

    from ledger.broker import Queued, missing_messages

    def enqueued_at(ids: list[int]) -> dict:
        return dict(fetch_rows(conn, "SELECT id, enqueued_at FROM batches WHERE id = ANY(%(ids)s) "
                                     "AND status = 'queued'", {"ids": ids})) if ids else {}

    try:
        client = redis.Redis.from_url(broker_url, socket_timeout=5)
        try:
            missing, undecided = missing_messages([Queued(r[0], r[1]) for r in rows], rows[0][2], client, queue,
                                                  enqueued_at)
        finally:
            client.close()
    except redis.RedisError:
        return None
    return None if undecided and not missing else len(missing)


# Each statement of a run's status, by name: run_status runs them, status_statements lists them
# (bench/reconcile_scale.py EXPLAINs each on a 100M-sample ledger).
#: Rejected rows by reason from their trigger-kept counts (migration 0015): a few rows, however many were rejected.
_REJECTED = "SELECT reason, n FROM run_rejected_counts WHERE run_id = %(run)s AND n <> 0"
#: Batches by status: open, done and dead from the run's counters (run_batch_counts, sharded by batch:
#: 64 rows, migration 0011); of the open ones, queued and running counted (a window and what the farm
#: holds), planned the rest.
_BATCHES = ("SELECT coalesce(sum(c.open_batches), 0), coalesce(sum(c.done_batches), 0), "
            "coalesce(sum(c.dead_batches), 0), "
            "(SELECT count(*) FROM batches WHERE run_id = %(run)s AND status = 'queued'), "
            "(SELECT count(*) FROM batches WHERE run_id = %(run)s AND status = 'running'), "
            "coalesce(sum(c.done_prompt_tokens), 0), coalesce(sum(c.done_completion_tokens), 0), "
            "coalesce(sum(c.done_samples), 0) FROM run_batch_counts c WHERE c.run_id = %(run)s")
#: The batches finished last, newest first (migration 0009's index): at most RECENT_BATCHES.
_RECENT = ("SELECT completion_tokens, n_samples, started_at, finished_at, now() FROM batches "
           "WHERE run_id = %(run)s AND status = 'done' AND finished_at > now() - make_interval(secs => %(w)s) "
           "ORDER BY finished_at DESC LIMIT %(n)s")
#: Failure reasons are counted over at most FAILED_REASONS_READ failed samples.
_FAILED = ("SELECT split_part(error, ':', 1), count(*) FROM (SELECT error FROM samples WHERE run_id = %(run)s "
           "AND status = 'failed' LIMIT %(n)s) f GROUP BY 1")
_BATCH_ERRORS = ("SELECT seq, status, failures, error FROM batches WHERE run_id = %(run)s AND error IS NOT NULL "
                 "AND status IN ('dead', 'queued') ORDER BY (status = 'dead') DESC, seq LIMIT 10")
#: Queued batches whose last attempt was refused by a worker that cannot run them (ledger/states.py
#: ``refused_reason``: "refused by <worker>: <why>"), by reason: no failure counts them, so without this
#: line a run that no worker can serve would only wait. Bounded by the queue's window of batches.
_REFUSED = ("SELECT substr(error, strpos(error, ': ') + 2) AS reason, count(*) AS batches, "
            "count(DISTINCT substr(error, 1, strpos(error, ': '))) AS workers FROM batches "
            "WHERE run_id = %(run)s AND status = 'queued' AND starts_with(error, %(prefix)s) "
            "GROUP BY 1 ORDER BY 2 DESC LIMIT 3")
# heartbeat_age_s: the oldest lease among the worker's batches, aged by the ledger's own clock.
_WORKERS = ("SELECT worker, count(*) AS batches, max(heartbeat_at) AS heartbeat_at, "
            "round(extract(epoch FROM now() - min(heartbeat_at))::numeric, 1)::float AS heartbeat_age_s, "
            "sum(n_samples) AS samples FROM batches "
            "WHERE run_id = %(run)s AND status = 'running' GROUP BY worker ORDER BY worker")


def status_statements(run_id: int, *, grace_s: float = QUEUED_GRACE_S) -> list[tuple[str, str, dict]]:
    """``(name, SQL, parameters)`` of every statement ``run_status`` runs for one run (Redis aside)."""
    run = {"run": run_id}
    return [("sample counts", _SAMPLE_COUNTS, run), ("quality counts", _QUALITY_COUNTS, run),
            ("rejected rows", _REJECTED, run), ("batches by status", _BATCHES, run),
            ("recent throughput", _RECENT, {**run, "w": RECENT_WINDOW_S, "n": RECENT_BATCHES}),
            ("failure reasons", _FAILED, {**run, "n": FAILED_REASONS_READ}), ("batch errors", _BATCH_ERRORS, run),
            ("refused", _REFUSED, {**run, "prefix": REFUSED_PREFIX}),
            ("workers", _WORKERS, run), ("projection", _PROJECTION, run), ("redelivered", _REDELIVERED, run),
            ("fake engine", _FAKE, run),
            ("oldest queued", _OLDEST_QUEUED, {**run, "grace": grace_s, "n": BROKER_CHECK_LIMIT})]


def run_status(conn: Any, run_name: str | None = None, *, broker_url: str | None = None) -> list[dict]:
    """Every figure of ``regen status`` per run; ``broker_url``: look up stalled queued batches on Redis too."""
    runs = list_runs(conn, run_name)
    out = []
    for run in runs:
        rid = run.id
        samples, quality = sample_counts(conn, rid)
        reasons = _counts(conn, _REJECTED, rid)
        duplicates = reasons.get("duplicate_id", 0)
        samples["rejected"] = sum(reasons.values()) - duplicates
        samples["duplicates"] = duplicates
        # Sums over the shards come back as numerics: ints for the JSON and the arithmetic.
        ((open_, done, dead, queued, running, prompt_tokens, completion_tokens, done_samples),) = (
            tuple(int(v) for v in row) for row in fetch_rows(conn, _BATCHES, {"run": rid}))
        batches = {s.value: 0 for s in BatchStatus}
        batches.update({"planned": max(0, open_ - queued - running), "queued": queued, "running": running,
                        "done": done, "dead": dead})
        recent_rows = fetch_rows(conn, _RECENT, {"run": rid, "w": RECENT_WINDOW_S, "n": RECENT_BATCHES})
        sample_failures = _counts(conn, _FAILED, rid, n=FAILED_REASONS_READ)
        batch_errors = fetch_dicts(conn, _BATCH_ERRORS, {"run": rid})
        refused = fetch_dicts(conn, _REFUSED, {"run": rid, "prefix": REFUSED_PREFIX})
        workers = fetch_dicts(conn, _WORKERS, {"run": rid})
        ((fake_batches, fake_refusals),) = fetch_rows(conn, _FAKE, {"run": rid})
        recent, window_s = recent_throughput(recent_rows, done_batches=done)
        remaining = samples["pending"]
        samples_per_s = recent[1] / window_s if recent[2] else 0.0
        out.append({
            "name": run.name,
            "model": run.model,
            "status": run.status,
            "status_reason": run.status_reason,
            "output": run.output_url,
            "queue": run.queue,
            "config_hash": run.config_hash,
            "created_at": run.created_at.isoformat(),
            "samples": samples,
            # Pending samples of running batches: being generated right now.
            "samples_in_flight": sum(int(w["samples"] or 0) for w in workers),
            "rejected_reasons": {k: v for k, v in sorted(reasons.items()) if k != "duplicate_id"},
            "failed_reasons": sample_failures,
            "quality": quality,
            "batches": batches,
            "tokens": {"prompt": int(prompt_tokens), "completion": int(completion_tokens)},
            "throughput": {
                "window_s": round(window_s, 1),
                "completion_tokens_per_s": round(recent[0] / window_s, 1) if recent[2] else 0.0,
                "samples_per_s": round(samples_per_s, 3),
                "eta_s": round(remaining / samples_per_s) if samples_per_s > 0 and remaining else None,
            },
            # Added for issue 6 (estimates): total tokens projected from the samples done so far.
            "projection": token_projection(conn, rid, samples, recent[0] / window_s if recent[2] else 0.0),
            "batch_errors": batch_errors,
            # Worker refusals (another model's worker, parsers its vLLM cannot build): no failure counted.
            "refused": [{"reason": r["reason"], "batches": int(r["batches"]), "workers": int(r["workers"])}
                        for r in refused],
            "broker": broker_figures(conn, rid, run.queue, broker_url),
            # worker/engine/fake.py: a benchmark run may be served by fake engines; a real run never is.
            "fake": {"benchmark": run.benchmark, "batches": int(fake_batches), "refusals": int(fake_refusals)},
            "workers": [{**w, "heartbeat_at": w["heartbeat_at"].isoformat() if w["heartbeat_at"] else None,
                         "samples": int(w["samples"] or 0)} for w in workers],
        })
    return out


_PROJECTION = ("SELECT coalesce(sum(done_completion_tokens), 0), coalesce(sum(done_samples), 0) "
               "FROM run_batch_counts WHERE run_id = %(run)s")


def recent_throughput(rows: list, *, done_batches: int) -> tuple[tuple[float, float, int], float]:
    """``((completion tokens, samples, batches), window_s)`` from the batches finished last (``_RECENT``).

    Fewer than RECENT_BATCHES in the window: all of them over the window, or over the time since
    the first of them started when they are the run's only done batches (a young run). As many:
    those after the oldest over the time since it finished.
    """
    if not rows:
        return (0.0, 0.0, 0), float(RECENT_WINDOW_S)
    now = rows[0][4]
    if len(rows) < RECENT_BATCHES:
        window_s = float(RECENT_WINDOW_S)
        if len(rows) >= done_batches:
            starts = [r[2] for r in rows if r[2] is not None]
            if starts:
                window_s = min(RECENT_WINDOW_S, max(1.0, (now - min(starts)).total_seconds()))
        counted = rows
    else:
        window_s = max(1.0, (now - rows[-1][3]).total_seconds())
        counted = rows[:-1]
    return ((float(sum(r[0] or 0 for r in counted)), float(sum(r[1] or 0 for r in counted)), len(counted)),
            window_s)


def token_projection(conn: Any, run_id: int, samples: dict, tokens_per_s: float) -> dict:
    """Total completion tokens projected from the finished samples, and the ETA by tokens.

    mean tokens per finished sample (done batches) × every sample of the run; the ETA
    divides the tokens still to generate by the recent tokens/s. Unlike the ETA by
    samples it is not fooled by short samples finishing first.
    """
    ((tokens, finished),) = fetch_rows(conn, _PROJECTION, {"run": run_id})
    tokens, finished = int(tokens), int(finished)
    all_samples = samples["pending"] + samples["done"] + samples["failed"]
    if not finished:
        return {"mean_completion_tokens": None, "completion_tokens_total": None,
                "completion_tokens_remaining": None, "eta_s": None}
    mean = tokens / finished
    total = round(mean * all_samples)
    remaining = max(0, total - tokens)
    return {"mean_completion_tokens": round(mean, 1), "completion_tokens_total": total,
            "completion_tokens_remaining": remaining,
            "eta_s": round(remaining / tokens_per_s) if tokens_per_s > 0 and remaining else None}


def _broker_lines(r: dict) -> list[str]:
    m = r.get("broker") or {}
    lines = []
    if m.get("queued_without_message"):
        lines.append(f"  STALLED   {m['queued_without_message']:,} queued batches have no message on queue {r['queue']} "
                     f"and none claimed {m['grace_s']:.0f} s after their last one: a live worker's reconciler "
                     "republishes them within a pass; if none runs, `regen requeue --run NAME`")
    elif m.get("queued_without_message") is None and m:
        lines.append(f"  broker    could not tell whether queue {r['queue']} holds the queued batches' messages")
    if m.get("stale_deliveries") or m.get("republishes"):
        lines.append(f"  messages  {m.get('republishes', 0):,} republished (lost, or held by a worker that died), "
                     f"{m.get('stale_deliveries', 0):,} stale deliveries acknowledged without work")
    return lines


def _fake_lines(r: dict) -> list[str]:
    f = r.get("fake") or {}
    lines = []
    if f.get("batches"):
        what = ("a benchmark run" if f.get("benchmark") else
                "NOT a benchmark run: these samples are random token ids, and `regen export` leaves them out")
        lines.append(f"  FAKE      {f['batches']:,} done batches were made by the fake engine ({what})")
    if f.get("refusals"):
        lines.append(f"  FAKE      {f['refusals']:,} deliveries refused by fake-engine workers (the run was not "
                     "submitted with --benchmark): stop the `--fake-engine` workers on queue " + r["queue"])
    return lines


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def render_status(runs: list[dict]) -> str:
    if not runs:
        return "no runs"
    lines = []
    for r in runs:
        s, b, t = r["samples"], r["batches"], r["throughput"]
        total = s["pending"] + s["done"] + s["failed"]
        pct = 100.0 * s["done"] / total if total else 0.0
        lines.append(f"run {r['name']}  [{r['status']}{': ' + r['status_reason'] if r['status_reason'] else ''}]"
                     f"  model {r['model']}{'  (benchmark run)' if (r.get('fake') or {}).get('benchmark') else ''}")
        lines.append(f"  samples   {s['done']:>9,} done  {s['failed']:>7,} failed  {s['pending']:>9,} pending"
                     f"  ({pct:.1f}% done)   rows rejected {s['rejected']:,}  duplicates {s['duplicates']:,}")
        lines.append("  batches   " + "  ".join(f"{v:,} {k}" for k, v in b.items() if v))
        lines.append(f"  tokens    {r['tokens']['completion']:,} generated, {r['tokens']['prompt']:,} prompt")
        lines.append(f"  speed     {t['completion_tokens_per_s']:,.0f} tok/s, {t['samples_per_s']:.2f} samples/s "
                     f"(last {_fmt_s(t['window_s'])})   ETA {_fmt_s(t['eta_s'])}")
        p = r.get("projection") or {}
        if p.get("completion_tokens_total") is not None:
            lines.append(f"  projected {p['completion_tokens_total']:,} tokens in all ({p['mean_completion_tokens']:,.0f}"
                         f" per sample so far)   ETA by tokens {_fmt_s(p['eta_s'])}")
        if r["rejected_reasons"]:
            lines.append("  rejected  " + ", ".join(f"{k} {v}" for k, v in r["rejected_reasons"].items()))
        if r.get("quality"):
            lines.append("  quality   " + ", ".join(f"{k} {v:,}" for k, v in r["quality"].items()))
        if r["failed_reasons"]:
            read = sum(r["failed_reasons"].values())
            of = f"(the first {read:,} of {s['failed']:,}) " if read < s["failed"] else ""
            lines.append("  failed    " + of + ", ".join(f"{k} {v}" for k, v in r["failed_reasons"].items()))
        for e in r["batch_errors"]:
            lines.append(f"  batch {e['seq']} [{e['status']}, {e['failures']} failures]: {str(e['error'])[:160]}")
        for x in r.get("refused") or []:
            lines.append(f"  REFUSED   {x['batches']:,} queued batches were last refused by a worker that cannot run "
                         f"them ({x['workers']:,} workers), no failure counted: {x['reason'][:200]}; the run waits "
                         "for a worker that can")
        lines.extend(_broker_lines(r))
        lines.extend(_fake_lines(r))
        for w in r["workers"]:
            lines.append(f"  worker {w['worker']}: {w['batches']} running")
        lines.append(f"  output    {r['output']}")
    return "\n".join(lines)
