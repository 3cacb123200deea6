"""The estimate probe's timeline read as phases: what each phase took and generated, and at what rate.

The probe (worker/engine/pilot.py) records ``(seconds since its start, vLLM's generated-token
counter)`` every ``POLL_S`` at most; the counter is None where the engine keeps no stats. These
turn that timeline into the figures the estimate uses: the settled, full-engine rate, the drain's
and the start-up's loss against it (docs/estimate.md, "Throughput: what the probe measures").
"""

from __future__ import annotations

#: How often the engine's generated-token counter and request count are read.
POLL_S = 0.2


def drain_phase(timeline: list[tuple[float, float | None]], start_s: float, full_tokens_per_s: float | None
           ) -> dict[str, float | None]:
    """The end of a run as the probe saw it: from the end of the settled phase until the engine was empty.

    ``drain_loss_s`` is the time a full engine would have saved: the drain's length less
    the tokens generated during it at the full-engine rate. It is what an engine loses at
    the end of a run (the estimate adds it once per engine), measured on this engine with
    this workload's lengths: the tail is emptied at whatever speed fewer sequences run.
    None without vLLM's token counter.
    """
    points = [(t, g) for t, g in timeline if g is not None and t >= start_s - POLL_S]
    if not points or full_tokens_per_s is None:
        return {"drain_s": None, "drain_tokens": None, "drain_loss_s": None}
    before = max((p for p in points if p[0] <= start_s + 1e-9), default=points[0], key=lambda p: p[0])
    end = points[-1]
    drain_s, drain_tokens = max(0.0, end[0] - before[0]), max(0.0, end[1] - before[1])
    loss = max(0.0, drain_s - drain_tokens / full_tokens_per_s)
    return {"drain_s": round(drain_s, 3), "drain_tokens": int(drain_tokens), "drain_loss_s": round(loss, 3)}


def start_phase(timeline: list[tuple[float, float | None]], end_s: float, full_tokens_per_s: float | None
           ) -> dict[str, float | None]:
    """The start of a run as the probe saw it: from the first submit until the last sample ended.

    Every conversation starts at once, as a run's first admission level does, and the
    engine holds young ones only (on a KV-limited engine it overcommits, then preempts as
    they grow). ``start_loss_s`` is the time that phase took beyond its tokens at the
    settled, full-engine rate (never below 0): what an engine loses filling up at a run's
    start, which the estimate adds once per engine, as it adds the drain. None without
    vLLM's token counter.
    """
    points = [(t, g) for t, g in timeline if g is not None and t <= end_s + POLL_S]
    if len(points) < 2 or full_tokens_per_s is None:
        return {"start_s": None, "start_tokens": None, "start_loss_s": None}
    first = points[0]
    last = max((p for p in points if p[0] <= end_s + 1e-9), default=points[-1], key=lambda p: p[0])
    start_s, start_tokens = max(0.0, last[0] - first[0]), max(0.0, last[1] - first[1])
    loss = max(0.0, start_s - start_tokens / full_tokens_per_s)
    return {"start_s": round(start_s, 3), "start_tokens": int(start_tokens), "start_loss_s": round(loss, 3)}


def full_engine_window(timeline: list[tuple[float, float | None]], start_s: float, end_s: float):
    """The (time, generated tokens) points bounding the settled, full-engine phase, or None.

    From the last sample's end (``start_s``) to the start of the drain (``end_s``);
    None without the engine's token counter or when nothing was generated in between.
    """
    points = [(t, g) for t, g in timeline if g is not None and t <= end_s + 1e-9]
    if len(points) < 2:
        return None
    start = next((p for p in points if p[0] >= start_s - 1e-9), points[0])
    end = points[-1]
    if end[0] - start[0] <= 0 or end[1] <= start[1]:
        return None
    return start, end


def window_rate(window) -> float:
    """Tokens a second between the two (time, generated tokens) points of :func:`full_engine_window`."""
    (ta, ga), (tb, gb) = window
    return (gb - ga) / (tb - ta)
