"""``regen report --run NAME --out DIR``: what a run produced, in a page a person reads in a minute.

Writes ``index.html`` (plots, tables, examples of each bad class), ``summary.txt`` (the
same figures as text), ``report.json`` (as numbers) and the PNG plots. The plot that
matters most is the loss-mask tokens per sample on log axes: a run of ``<think></think>
OK.`` stubs is a spike at 6 tokens that nobody can miss.

Per-sample figures come from the ledger's columns of committed samples (all of them,
one streamed query: the worker wrote those columns from the same rows it uploaded).
Per-generation figures and the examples come from the committed output shards
themselves, verified against the ledger's sha256: every shard of a small run, an
evenly spread subset of ``max_shards`` of a large one (the report says how many).
"""

from __future__ import annotations

import html
import json
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ledger.objects import ObjectStore
from ledger.quality import CLASSES, judge
from ledger.runs import RunRecord, find_run

from . import report_plots
from .outputs import (
    FAKE_ROWS_WHY,
    committed_samples,
    is_fake_row,
    read_shards,
    row_quality,
    sample_status_counts,
)

#: Output shards read for per-generation figures: 200 batches of 64 is ~13K samples,
#: plenty for shares and examples, and minutes rather than hours of S3 reads on a 1M run.
DEFAULT_MAX_SHARDS = 200
#: Examples shown per bad class, and characters of each text shown.
EXAMPLES_PER_CLASS = 3
EXAMPLE_CHARS = 400
PERCENTILES = (0, 1, 10, 50, 90, 99, 100)


@dataclass
class _Figures:
    statuses: dict[str, int]
    classes: Counter = field(default_factory=Counter)
    loss_tokens: array = field(default_factory=lambda: array("q"))
    reasoning_tokens: array = field(default_factory=lambda: array("q"))
    answer_tokens: array = field(default_factory=lambda: array("q"))
    tool_calls: Counter = field(default_factory=Counter)
    last_finish: Counter = field(default_factory=Counter)
    per_source: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    event_finish: Counter = field(default_factory=Counter)
    event_classes: Counter = field(default_factory=Counter)
    events: int = 0
    tool_call_events: int = 0
    #: Committed samples a fake engine made (their batch marked fake, or their row's ``fake_engine``).
    fake_samples: int = 0
    fake_rows_read: int = 0
    shards_read: int = 0
    shards_total: int = 0
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))


def write_report(sessions: sessionmaker[Session], store: ObjectStore, run_name: str, out_dir: str | Path, *,
                 max_shards: int | None = DEFAULT_MAX_SHARDS) -> Path:
    """Write the report of ``run_name`` into ``out_dir`` (created); returns the path of index.html.

    ``max_shards`` caps the output shards read for per-generation figures (None: all).

    Raises:
        ConfigError: no such run. ChecksumMismatch, StoreError, ShardError: a committed shard is unreadable.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with sessions() as session:
        run = find_run(session, run_name)
        figures = _Figures(statuses=sample_status_counts(session, run.id))
        shards = _ledger_figures(session, run, figures)
    _shard_figures(store, run, shards, max_shards, figures)

    plots = {
        "loss_mask_tokens.png": report_plots.loss_mask_histogram(_np(figures.loss_tokens),
                                                                  out / "loss_mask_tokens.png"),
        "lengths.png": report_plots.length_histograms(_np(figures.reasoning_tokens), _np(figures.answer_tokens),
                                                      out / "lengths.png"),
        "quality.png": report_plots.bar_chart(_ordered_classes(figures.classes), out / "quality.png",
                                              "quality classes of committed samples", colored_by_class=True),
        "finish_reasons.png": report_plots.bar_chart(dict(figures.event_finish.most_common()),
                                                     out / "finish_reasons.png",
                                                     f"finish reason of each generation ({figures.events:,} "
                                                     f"generations in {figures.shards_read} shards)"),
        "tool_calls.png": report_plots.bar_chart(_tool_call_buckets(figures.tool_calls), out / "tool_calls.png",
                                                 "tool calls per done sample"),
        "sources.png": report_plots.sources_chart(figures.per_source, out / "sources.png"),
    }
    numbers = _numbers(run, figures)
    (out / "report.json").write_text(json.dumps(numbers, indent=2) + "\n")
    summary = _summary(numbers)
    (out / "summary.txt").write_text(summary + "\n")
    index = out / "index.html"
    index.write_text(_html(numbers, summary, list(plots), figures.examples))
    return index


def _ledger_figures(session: Session, run: RunRecord, figures: _Figures) -> dict[str, str | None]:
    """Per-sample figures from the ledger; returns the committed output shards (url -> sha256)."""
    shards: dict[str, str | None] = {}
    for row in committed_samples(session, run.id):
        shards[row.output_key] = row.output_sha256
        figures.fake_samples += bool(row.fake)
        quality = row.quality or ("failed" if row.status == "failed" else "unclassified")
        figures.classes[quality] += 1
        figures.per_source[row.source_file][quality] += 1
        if row.status != "done":
            continue
        figures.loss_tokens.append(row.completion_tokens or 0)
        if row.reasoning_tokens is not None:
            figures.reasoning_tokens.append(row.reasoning_tokens)
        if row.answer_tokens is not None:
            figures.answer_tokens.append(row.answer_tokens)
        figures.tool_calls[row.tool_calls or 0] += 1
        figures.last_finish[row.finish_reason or "none"] += 1
    return shards


def _shard_figures(store: ObjectStore, run: RunRecord, shards: dict[str, str | None], max_shards: int | None,
                   figures: _Figures) -> None:
    ordered = sorted(shards.items())
    figures.shards_total = len(ordered)
    if max_shards is not None and len(ordered) > max_shards:
        step = len(ordered) / max_shards  # evenly spread over the run: early and late batches both
        ordered = [ordered[int(n * step)] for n in range(max_shards)]
    for _, rows in read_shards(store, ordered):
        figures.shards_read += 1
        for row in rows:
            if row.get("status") != "done":
                continue
            figures.fake_rows_read += is_fake_row(row)
            quality, details = row_quality(row, run.thresholds)
            for event, detail in zip(row.get("events") or [], details, strict=True):
                figures.events += 1
                figures.event_finish[event.get("finish_reason") or "none"] += 1
                figures.event_classes[detail["quality"]] += 1
                figures.tool_call_events += bool(event.get("is_tool_call"))
            examples = figures.examples[quality]
            if quality != "ok" and len(examples) < EXAMPLES_PER_CLASS:
                examples.append(_example(row, quality, details))


def _example(row: dict[str, Any], quality: str, details: list[dict[str, Any]]) -> dict[str, Any]:
    worst_turn = next((n for n, d in enumerate(details) if d["quality"] == quality), len(details) - 1)
    event = (row.get("events") or [{}])[worst_turn]
    messages = row.get("messages") or []
    index = event.get("message_index")
    message = messages[index] if isinstance(index, int) and index < len(messages) else {}
    source = row.get("source") or {}
    return {"sample_id": row["sample_id"], "source": f"{source.get('file')}:{source.get('row')}",
            "turn": worst_turn, "flags": details[worst_turn]["flags"] if details else [],
            "completion_tokens": len(event.get("completion_token_ids") or []),
            "finish_reason": event.get("finish_reason"),
            "reasoning": (message.get("reasoning_content") or "")[:EXAMPLE_CHARS],
            "answer": (message.get("content") or "")[:EXAMPLE_CHARS]}


def _ordered_classes(classes: Counter) -> dict[str, int]:
    return {c: classes[c] for c in (*CLASSES, "unclassified") if classes[c]}


def _tool_call_buckets(tool_calls: Counter) -> dict[str, int]:
    buckets: Counter = Counter()
    for calls, n in tool_calls.items():
        buckets["5+" if calls >= 5 else str(calls)] += n
    return {k: buckets[k] for k in ("0", "1", "2", "3", "4", "5+") if buckets[k]}


def _np(values: array):
    """A numpy view of an array('q') (no copy): plotting 1M Python ints one by one takes seconds."""
    import numpy as np

    return np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)


def _percentiles(values: array) -> dict[str, int]:
    if not values:
        return {}
    import numpy as np

    found = np.percentile(_np(values), PERCENTILES, method="nearest")
    return {f"p{p}": int(v) for p, v in zip(PERCENTILES, found, strict=True)}


def _numbers(run: RunRecord, f: _Figures) -> dict[str, Any]:
    committed = sum(f.classes.values())
    done = len(f.loss_tokens)
    classified = {c: f.classes[c] for c in CLASSES if f.classes[c]}
    gate = judge(classified, run.thresholds)
    per_source = {}
    for name in sorted(f.per_source):
        counts = f.per_source[name]
        total = sum(counts.values())
        bad = [(c, n) for c, n in counts.most_common() if c not in ("ok", "unclassified")]
        per_source[name] = {"committed": total, "ok_share": round(counts["ok"] / total, 4),
                            "worst_bad_class": bad[0][0] if bad else None,
                            "classes": dict(sorted(counts.items()))}
    return {
        "run": {"name": run.name, "status": run.status, "status_reason": run.status_reason, "model": run.model,
                "config_hash": run.config_hash, "output": run.output_url},
        "samples": {**f.statuses, "committed": committed},
        "quality": {"counts": _ordered_classes(f.classes),
                    "shares": {c: round(n / committed, 4) for c, n in _ordered_classes(f.classes).items()}
                    if committed else {},
                    "gate": {"would_pause": gate.pause, "reason": gate.reason, "exceeded": list(gate.exceeded),
                             "limits": dict(run.thresholds.gate), "overridden": run.thresholds.gate_overridden}},
        "loss_mask_tokens": {**_percentiles(f.loss_tokens), "under_16": int((_np(f.loss_tokens) < 16).sum()),
                             "samples": done},
        "reasoning_tokens": _percentiles(f.reasoning_tokens),
        "answer_tokens": _percentiles(f.answer_tokens),
        "finish_reason_last_turn": dict(f.last_finish.most_common()),
        "tool_calls": {"samples_with_calls": sum(n for k, n in f.tool_calls.items() if k),
                       "rate": round(sum(n for k, n in f.tool_calls.items() if k) / done, 4) if done else 0.0,
                       "per_sample": _tool_call_buckets(f.tool_calls)},
        "generations": {"read_from_shards": f"{f.shards_read} of {f.shards_total}", "count": f.events,
                        "finish_reasons": dict(f.event_finish.most_common()),
                        "classes": dict(f.event_classes.most_common()),
                        "tool_call_share": round(f.tool_call_events / f.events, 4) if f.events else 0.0},
        "per_source": per_source,
        # Flagged, never hidden: a real run holding fake rows is a run to look at (worker/engine/fake.py).
        "fake": {"benchmark_run": run.benchmark, "fake_samples": f.fake_samples,
                 "fake_rows_in_shards_read": f.fake_rows_read, "why": FAKE_ROWS_WHY},
    }


def _summary(n: dict[str, Any]) -> str:
    run, samples, quality = n["run"], n["samples"], n["quality"]
    lines = [f"run {run['name']}  [{run['status']}{': ' + run['status_reason'] if run['status_reason'] else ''}]",
             f"  model {run['model']}  config {run['config_hash'][:12]}",
             "samples   " + "  ".join(f"{v:,} {k}" for k, v in samples.items()),
             "quality   " + ", ".join(f"{c} {quality['counts'][c]:,} ({s:.1%})" for c, s in quality["shares"].items()),
             f"gate      {'WOULD PAUSE: ' if quality['gate']['would_pause'] else ''}{quality['gate']['reason']}"]
    fake = n["fake"]
    if fake["fake_samples"] or fake["fake_rows_in_shards_read"]:
        lines.append(f"FAKE      {max(fake['fake_samples'], fake['fake_rows_in_shards_read']):,} committed samples were "
                     f"made by the fake engine ({'a benchmark run' if fake['benchmark_run'] else 'NOT a benchmark run'}"
                     f"): {fake['why']}")
    for name in ("loss_mask_tokens", "reasoning_tokens", "answer_tokens"):
        values = n[name]
        shown = "  ".join(f"{k} {v:,}" for k, v in values.items() if k.startswith("p"))
        lines.append(f"{name:<17} {shown or '-'}")
    lm = n["loss_mask_tokens"]
    if lm["samples"]:
        lines.append(f"  {lm['under_16']:,} of {lm['samples']:,} done samples ({lm['under_16'] / lm['samples']:.1%}) "
                     "have under 16 trainable tokens")
    tc, gen = n["tool_calls"], n["generations"]
    lines.append(f"tool calls  {tc['samples_with_calls']:,} of {n['loss_mask_tokens']['samples']:,} done samples "
                 f"call a tool ({tc['rate']:.1%}); "
                 f"{gen['tool_call_share']:.1%} of generations are tool calls")
    lines.append("finish (last turn)  " + ", ".join(f"{k} {v:,}" for k, v in n["finish_reason_last_turn"].items()))
    lines.append(f"finish (every generation, {gen['read_from_shards']} shards)  "
                 + ", ".join(f"{k} {v:,}" for k, v in gen["finish_reasons"].items()))
    lines.append("per source file (committed, ok share, worst bad class):")
    for name, s in n["per_source"].items():
        lines.append(f"  {name}  {s['committed']:,}  ok {s['ok_share']:.1%}  {s['worst_bad_class'] or '-'}")
    return "\n".join(lines)


def _html(n: dict[str, Any], summary: str, plots: list[str], examples: dict[str, list[dict]]) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(name)}</td><td>{s['committed']:,}</td><td>{s['ok_share']:.1%}</td>"
        f"<td>{esc(s['worst_bad_class'] or '-')}</td><td>{esc(json.dumps(s['classes']))}</td></tr>"
        for name, s in n["per_source"].items())
    shown = []
    for quality in CLASSES:
        for ex in examples.get(quality, []):
            shown.append(
                f"<div class=ex><b>{esc(quality)}</b> sample <code>{esc(ex['sample_id'])}</code> "
                f"({esc(ex['source'])}, turn {ex['turn']}, {ex['completion_tokens']} tokens, finish "
                f"{esc(str(ex['finish_reason']))}, flags {esc(', '.join(ex['flags']))})"
                f"<pre>reasoning: {esc(ex['reasoning'])}\n\nanswer: {esc(ex['answer'])}</pre></div>")
    images = "".join(f'<figure><img src="{esc(p)}" alt="{esc(p)}"></figure>' for p in plots)
    pause = n["quality"]["gate"]["would_pause"]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>regen report: {esc(n['run']['name'])}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}pre{{white-space:pre-wrap;background:#f5f5f5;
padding:.6em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2em .5em}}
.alarm{{color:#b71c1c;font-weight:bold}}img{{max-width:100%}}.ex{{margin:1em 0}}</style></head><body>
<h1>regen report: {esc(n['run']['name'])}</h1>
<p class="{'alarm' if pause else ''}">{'The quality gate would pause this run: ' if pause else ''}{esc(n['quality']['gate']['reason'])}</p>
<pre>{esc(summary)}</pre>
{images}
<h2>Per source file</h2>
<table><tr><th>file</th><th>committed</th><th>ok</th><th>worst bad class</th><th>classes</th></tr>{rows}</table>
<h2>Examples of each bad class</h2>
{''.join(shown) or '<p>none in the shards read</p>'}
</body></html>
"""
