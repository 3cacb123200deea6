"""Text for people: an estimate with its arithmetic, and estimate-against-actual tables."""

from __future__ import annotations

from typing import Any


def _n(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _big(x: float) -> str:
    """1,369,172,000 → "1.37 B" (tokens read better with a magnitude)."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:.0f}"


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    if h >= 48:
        return f"{h:,.1f} h ({h / 24:.1f} days)"
    if h >= 1:
        return f"{h:,.2f} h"
    return f"{h:.3f} h ({h * 60:.1f} min)"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(d: dict | None, fmt) -> str:
    if not d or d["ci_low"] == d["ci_high"] == d["value"]:
        return ""
    return f"{fmt(d['ci_low'])} – {fmt(d['ci_high'])}"


def render_estimate(doc: dict[str, Any]) -> str:
    """The estimate as a table, the arithmetic behind it (checkable by hand) and its assumptions."""
    cfg = doc.get("config")
    tp = doc["throughput"]
    lines = [f"regen estimate: {doc['model'] or 'hand calculation'}"]
    if cfg:
        sampling = ", ".join(f"{k} {cfg[k]}" for k in ("temperature", "top_p", "top_k") if k in cfg)
        thinking = (f"Harmony, reasoning effort {cfg['reasoning_effort']}" if cfg.get("chat_format") == "harmony"
                    else f"thinking {cfg['thinking']}")
        lines.append(f"  config   max_tokens {cfg['max_tokens']}, {thinking}, {sampling}, seed {cfg['seed']}")
    lines.append(f"  dataset  {doc['rows']:,} rows to generate ({doc['rows_read']:,} read, {doc['rejected']:,} "
                 f"rejected, {doc['duplicates']:,} duplicates)")
    if doc["sample_size"]:
        lines.append(f"  sample   {doc['sample_size']:,} conversations in {len(doc['strata'])} strata"
                     + (f", generated in {tp['probe_wall_s']:.1f} s on {tp.get('engine_version') or 'the engine'}"
                        if tp.get("probe_wall_s") else ""))
    lines += ["", f"  {'':<26}{'estimate':>18}   95% interval"]

    def row(label: str, value: str, interval: str = "") -> None:
        lines.append(f"  {label:<26}{value:>18}   {interval}")

    mean, total = doc["mean_output_tokens"], doc["total_output_tokens"]
    row("output tokens per row", _n(mean["value"], 1), _ci(mean, lambda v: _n(v, 1)))
    if doc["reasoning_tokens"] and doc["rows"]:
        row("  reasoning / answer", f"{_n(doc['reasoning_tokens']['value'] / doc['rows'], 1)} / "
            f"{_n(doc['answer_tokens']['value'] / doc['rows'], 1)}")
    if doc["truncated_share"]:
        row("cut at max_tokens", _pct(doc["truncated_share"]["value"]), _ci(doc["truncated_share"], _pct))
    row("total output tokens", _n(total["value"]), _ci(total, _big))
    prompt = doc.get("mean_prompt_tokens")  # an estimate saved before prompts were counted has none
    if prompt:
        row("prompt tokens per row", _n(prompt["value"], 1), _ci(prompt, lambda v: _n(v, 1)))
        row("total prompt tokens", _n(doc["total_prompt_tokens"]["value"]), _ci(doc["total_prompt_tokens"], _big))
    tps = doc["tokens_per_s"]
    row("tokens/s per engine", _n(tps, 0) if tps else "-", tp["source"])
    if doc.get("mtp"):  # an estimate saved before MTP was priced has none
        lines.append(f"  {doc['mtp']['line']}")
    for card, held in (doc.get("memory") or {}).items():
        state = f"{_n(held['state_mib_per_sequence'], 1)} MiB of state + " if held["state_mib_per_sequence"] else ""
        lines.append(f"  memory   an {card} alone holds {held['sequences']:,.1f} sequences of "
                     f"{held['tokens_per_sequence']:,} tokens ({state}{_n(held['kv_kib_per_token'], 1)} KiB a token; "
                     f"{held['blocks']:,} blocks of {held['block_size']}: worker/engine/cache_plan.py)")
    engine_h, wall_h = doc["engine_hours"], doc["wall_hours"]
    if engine_h:
        row("engine-hours", _n(engine_h["value"], 2 if engine_h["value"] < 100 else 1),
            _ci(engine_h, lambda v: _n(v, 2 if v < 100 else 1)))
        g = doc["engines"]
        row(f"wall-clock, {g} engine{'s' if g != 1 else ''}", _hours(wall_h["value"]), _ci(wall_h, _hours))

    lines += ["", "  arithmetic"]
    lines.append(f"    total tokens = {doc['rows']:,} rows × {mean['value']:,.1f} tokens/row = {total['value']:,.0f} "
                 "tokens" + (f"  (Σ over the {len(doc['strata'])} strata of rows × the stratum's mean)"
                             if doc["strata"] else ""))
    if engine_h:
        g, work = doc["engines"], doc["work_hours"]["value"]
        lines.append(f"    work         = {total['value']:,.0f} tokens / {tps:,.1f} tok/s = {work * 3600:,.0f} s "
                     f"= {work:,.3f} h on full engines")
        start = doc.get("start_hours") or 0.0  # an estimate saved before the start-up allowance has none
        lines.append(f"    engine time  = {work:,.3f} h + {g} engine(s) × ({start:.4f} h start-up + "
                     f"{doc['drain_hours']:.4f} h drain) = {engine_h['value']:,.3f} engine-hours")
        lines.append(f"    wall-clock   = {work:,.3f} h / {g} + {start:.4f} h start-up + {doc['drain_hours']:.4f} h drain + "
                     f"{doc['spread_hours']:.4f} h spread = {wall_h['value']:,.3f} h = {wall_h['value'] / 24:.2f} days")
    lines += ["", "  assumptions"]
    lines += [f"    - {a}" for a in doc["assumptions"]]
    return "\n".join(lines)


def _fmt_metric(name: str, v: float | None) -> str:
    if v is None:
        return "-"
    if "cut at" in name:
        return _pct(v)
    if "hours" in name:
        return f"{v:,.4f}" if v < 10 else f"{v:,.1f}"
    if "per row" in name or "tokens/s" in name:
        return _n(v, 1)
    return _n(v)


def render_compare(result: dict[str, Any]) -> str:
    """Estimate and actual side by side, with actual/estimate and whether the actual fell in the interval."""
    lines = [f"run {result['run']}: estimate ({result['estimate_created_at']}, tokens/s "
             f"{result['throughput_source']}) against actual"]
    if result["partial"]:
        lines.append(f"  NOTE: the run is not finished ({result['actual']['pending']:,} samples pending): "
                     "actual figures so far")
    if not result["config_matches"]:
        lines.append("  NOTE: the run's model or sampling differs from the estimate's")
    lines.append(f"  {'metric':<24}{'estimate':>16}  {'95% interval':<27}{'actual':>16}{'actual/est':>12}  in CI")
    for r in result["rows"]:
        name = r["metric"]
        interval = ""
        if r["ci_low"] is not None:
            interval = f"{_fmt_metric(name, r['ci_low'])} – {_fmt_metric(name, r['ci_high'])}"
        ratio = "-" if r["actual_over_estimate"] is None else f"{r['actual_over_estimate']:.3f}"
        inside = "" if r["in_ci"] is None else ("yes" if r["in_ci"] else "no")
        lines.append(f"  {name:<24}{_fmt_metric(name, r['estimate']):>16}  {interval:<27}"
                     f"{_fmt_metric(name, r['actual']):>16}{ratio:>12}  {inside}")
    a = result["actual"]
    lines.append(f"  actual engine time: union of busy intervals of {a['batches']:,} batches on {a['engines']} "
                 f"worker(s); wall: first batch start to last batch finish")
    return "\n".join(lines)
