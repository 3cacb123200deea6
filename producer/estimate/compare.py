"""``regen estimate --compare RUN``: the saved estimate beside what the run actually took.

Actual figures come from the ledger only:

* tokens: the sum over the run's samples (failed samples count 0, as in the estimate);
* engine time: per worker (one engine each), the *union* of its batches' busy
  intervals ``[started_at, finished_at]``, summed over workers. A worker runs K
  batches at once, so ``Σ (finished − started)`` would count its time up to K times;
* wall time: from the first batch's start to the last batch's finish.

Only a batch's last, successful attempt has its interval in the ledger: time spent
on attempts that failed or were taken over is not counted.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger.runs import find_run

from . import arithmetic as em


def actual_from_ledger(session: Session, run_name: str) -> dict[str, Any]:
    """What run ``run_name`` took, from its samples and batches.

    Raises:
        RunNotFound: no run of that name.
    """
    run = find_run(session, run_name)
    counts = session.execute(text(
        "SELECT count(*) FILTER (WHERE status = 'done') AS done, count(*) FILTER (WHERE status = 'failed') AS failed, "
        "count(*) FILTER (WHERE status = 'pending') AS pending, coalesce(sum(completion_tokens), 0) AS tokens, "
        "coalesce(sum(reasoning_tokens), 0) AS reasoning, coalesce(sum(answer_tokens), 0) AS answer, "
        "coalesce(sum(prompt_tokens), 0) AS prompt, "
        "count(*) FILTER (WHERE finish_reason = 'length') AS truncated FROM samples WHERE run_id = :run"),
        {"run": run.id}).mappings().one()
    batches = session.execute(text(
        "SELECT worker, extract(epoch FROM started_at) AS s, extract(epoch FROM finished_at) AS f FROM batches "
        "WHERE run_id = :run AND status = 'done' AND started_at IS NOT NULL AND finished_at IS NOT NULL"),
        {"run": run.id}).all()
    intervals = [(b.worker or "?", float(b.s), float(b.f)) for b in batches]
    engine_s = em.engine_busy_seconds(intervals)
    wall_s = (max(f for _, _, f in intervals) - min(s for _, s, _ in intervals)) if intervals else 0.0
    finished = int(counts["done"]) + int(counts["failed"])
    tokens = int(counts["tokens"])
    return {
        "run": run.name,
        "status": run.status,
        "output_url": run.output_url,
        "config_hash": run.config_hash,
        "rows": finished + int(counts["pending"]),
        "finished": finished,
        "pending": int(counts["pending"]),
        "failed": int(counts["failed"]),
        "total_output_tokens": tokens,
        "reasoning_tokens": int(counts["reasoning"]),
        "answer_tokens": int(counts["answer"]),
        "mean_output_tokens": tokens / finished if finished else 0.0,
        "total_prompt_tokens": int(counts["prompt"]),
        "truncated_share": int(counts["truncated"]) / finished if finished else 0.0,
        "engines": len({w for w, _, _ in intervals}),
        "batches": len(intervals),
        "engine_hours": engine_s / 3600.0,
        "wall_hours": wall_s / 3600.0,
        "tokens_per_s": tokens / engine_s if engine_s > 0 else None,
    }


def _row(name: str, estimate: dict | float | None, actual: float | None) -> dict[str, Any]:
    if isinstance(estimate, dict):
        value, low, high = estimate["value"], estimate["ci_low"], estimate["ci_high"]
    else:
        value, low, high = estimate, None, None
    ratio = actual / value if actual is not None and value else None
    inside = (low <= actual <= high) if actual is not None and low is not None else None
    return {"metric": name, "estimate": value, "ci_low": low, "ci_high": high, "actual": actual,
            "actual_over_estimate": ratio,
            "error": (value - actual) / actual if actual and value is not None else None, "in_ci": inside}


def compare(estimate: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
    """Estimate and actual side by side: one row per metric, with actual/estimate and whether
    the actual value fell in the estimate's interval.

    The estimate's hours were for its own ``engines``; when the run used another number
    of workers they are recomputed for that number (same work, drain and spread rules).
    """
    engines = actual["engines"] or estimate.get("engines", 1)
    wall = estimate.get("wall_hours")
    engine_h = estimate.get("engine_hours")
    work = estimate.get("work_hours")
    if work and engines != estimate.get("engines"):
        engine_iv, wall_iv = em.run_hours(em.Interval(work["value"], work["ci_low"], work["ci_high"]), engines,
                                          estimate.get("longest_conversation_s", 0.0),
                                          estimate.get("drain_loss_s"), estimate.get("start_loss_s"))
        engine_h, wall = engine_iv.as_dict(), wall_iv.as_dict()
    partial = actual["pending"] > 0
    rows = [
        _row("rows", estimate["rows"], actual["rows"]),
        _row("output tokens", estimate["total_output_tokens"], actual["total_output_tokens"]),
        _row("  reasoning", estimate["reasoning_tokens"], actual["reasoning_tokens"]),
        _row("  answer", estimate["answer_tokens"], actual["answer_tokens"]),
        _row("tokens per row", estimate["mean_output_tokens"], actual["mean_output_tokens"]),
        # An estimate saved before prompts were counted has no row for them.
        *([_row("prompt tokens", estimate["total_prompt_tokens"], actual["total_prompt_tokens"])]
          if estimate.get("total_prompt_tokens") else []),
        _row("cut at max_tokens", estimate["truncated_share"], actual["truncated_share"]),
        _row("tokens/s per engine", estimate.get("tokens_per_s"), actual["tokens_per_s"]),
        _row("engine-hours", engine_h, actual["engine_hours"]),
        _row(f"wall hours ({engines} engine{'s' if engines != 1 else ''})", wall, actual["wall_hours"]),
    ]
    return {"run": actual["run"], "partial": partial, "engines": engines,
            "estimate_created_at": estimate.get("created_at"),
            "throughput_source": (estimate.get("throughput") or {}).get("source"),
            # A run with another model or sampling than the estimate's is not the run estimated.
            "config_matches": estimate.get("config_hash") == actual["config_hash"],
            "rows": rows, "actual": actual}
