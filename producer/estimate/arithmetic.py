"""The arithmetic of ``regen estimate``: stratified totals, bootstrap intervals, hours, what-if.

Pure Python and pure functions (no numpy: the producer's dependencies stay small),
so each step can be checked by hand and tested alone.

Notation: stratum h holds N_h samples of the dataset, n_h of them were generated
in the probe, with per-sample values y_hi. The stratified estimate of a total is
``Σ_h N_h · mean_i(y_hi)``; its interval comes from resampling each stratum's
values with replacement (the stratified bootstrap) and taking percentiles.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

#: Resamples for the bootstrap. 1,000 puts the 2.5/97.5 percentiles within a few
#: tenths of a percent of where 100,000 would, in well under a second.
BOOTSTRAP_RESAMPLES = 1000
#: The bootstrap's seed: the same probe results give the same interval.
BOOTSTRAP_SEED = 20261129
#: Two-sided coverage of every interval.
CONFIDENCE = 0.95

#: Peak memory bandwidth of one GPU, TB/s (vendor datasheets, SXM/largest-memory
#: parts). Decode of a dense model is memory-bound (docs/estimate.md, performance
#: notes §2), so output tokens/s scales with bandwidth to first order. Other factors
#: (HBM size → concurrency, FP8/FP4 support, kernels) are not in the ratio: an
#: extrapolation from a measurement, not a measurement.
GPU_BANDWIDTH_TBPS: dict[str, float] = {
    "A100": 2.039,    # A100 80 GB SXM (HBM2e); the 40 GB part has 1.555
    "L40S": 0.864,    # GDDR6
    "H100": 3.35,     # H100 SXM 80 GB (HBM3); PCIe has 2.0
    "H200": 4.8,      # H200 SXM 141 GB (HBM3e)
    "B200": 8.0,      # B200 192 GB (HBM3e)
    "RTX-PRO-6000": 1.792,  # RTX PRO 6000 Blackwell, 96 GB GDDR7
}


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap interval (``ci_low`` ≤ ``value`` ≤ ``ci_high`` usually)."""

    value: float
    ci_low: float
    ci_high: float

    def scaled(self, factor: float, offset: float = 0.0) -> Interval:
        """``value · factor + offset``, interval alike (for monotone transformations)."""
        return Interval(self.value * factor + offset, self.ci_low * factor + offset, self.ci_high * factor + offset)

    def as_dict(self, digits: int | None = None) -> dict[str, float]:
        d = asdict(self)
        return {k: round(v, digits) if digits is not None else v for k, v in d.items()}


def stratified_total(strata: Mapping[str, tuple[int, Sequence[float]]]) -> float:
    """``Σ_h N_h · mean(y_h)`` over ``{stratum: (N_h, values)}``; strata without values add 0."""
    return sum(n * (sum(ys) / len(ys)) for n, ys in strata.values() if ys)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values, linear interpolation (numpy's default)."""
    if not sorted_values:
        raise ValueError("percentile of nothing")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def stratified_bootstrap(
    strata: Mapping[str, tuple[int, Sequence[Sequence[float]]]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> list[list[float]]:
    """Bootstrap replicates of several stratified totals at once (``Σ_h N_h · mean``).

    Args:
        strata: ``{stratum: (N_h, rows)}`` where each row is a tuple of metrics
            (tokens, reasoning tokens, ...); every row of a stratum has the same length.
        resamples: number of bootstrap replicates.
        seed: seed of the resampling.

    Returns:
        For each metric, the sorted list of its ``resamples`` replicate totals.
    """
    rng = random.Random(seed)
    items = [(n, rows) for n, rows in strata.values() if rows]
    if not items:
        return []
    width = len(items[0][1][0])
    replicates: list[list[float]] = [[0.0] * resamples for _ in range(width)]
    # A stratum with one draw shows no spread of its own; those strata are "collapsed"
    # for the variance (the usual survey practice): each resamples from all of their draws.
    singles = [rows[0] for n, rows in items if len(rows) == 1 and n > 1]
    for n, rows in items:
        k = len(rows)
        means = [sum(row[m] for row in rows) / k for m in range(width)]
        # Finite-population correction (rescaled bootstrap): a stratum drawn whole has no
        # sampling error, a 10% draw a little less than an infinite population's.
        shrink = math.sqrt(max(0.0, 1.0 - k / n)) if n else 0.0
        pool = singles if k == 1 and len(singles) > 1 else rows
        for r in range(resamples):
            # One stratum resampled: k draws with replacement.
            picks = rng.choices(pool, k=k) if shrink else rows
            for m in range(width):
                boot_mean = sum(row[m] for row in picks) / k
                replicates[m][r] += n * (means[m] + shrink * (boot_mean - means[m]))
    for values in replicates:
        values.sort()
    return replicates


def interval_from(value: float, sorted_replicates: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The percentile interval of the replicates around the point estimate."""
    if not sorted_replicates:
        return Interval(value, value, value)
    tail = (1.0 - confidence) / 2
    return Interval(value, percentile(sorted_replicates, tail), percentile(sorted_replicates, 1.0 - tail))


def scaled_tokens_per_s(reference_tokens_per_s: float, reference_gpu: str, gpu: str) -> float:
    """Throughput on ``gpu`` from one measured on ``reference_gpu``, by memory bandwidth.

    Raises:
        KeyError: a GPU type not in :data:`GPU_BANDWIDTH_TBPS`.
    """
    return reference_tokens_per_s * GPU_BANDWIDTH_TBPS[gpu] / GPU_BANDWIDTH_TBPS[reference_gpu]


def hours(tokens: float, tokens_per_s: float) -> float:
    """Engine-hours to generate ``tokens`` at ``tokens_per_s`` on a full engine."""
    return tokens / tokens_per_s / 3600.0


def drain_allowance_s(longest_conversation_s: float, measured_loss_s: float | None = None) -> float:
    """Time one engine loses at the end of a run, when the queue is empty.

    Measured by the probe when it could be (``measured_loss_s``: it lets its engine drain
    as a run's end does and compares with the full-engine rate, worker/engine/pilot.py). Else a
    bound: the last conversations finish one by one over up to the longest conversation's
    time, the engine emptying about linearly, so half of that time is lost. The bound is
    pessimistic on GPUs, where a thinning batch decodes each sequence faster.
    """
    if measured_loss_s is not None:
        return measured_loss_s
    return 0.5 * longest_conversation_s


def spread_allowance_s(longest_conversation_s: float, engines: int) -> float:
    """How much later than the average engine the last of ``engines`` finishes.

    They run out of work at about the same moment and finish what they hold spread
    over up to one conversation's time; with one engine there is no spread.
    """
    return (1.0 - 1.0 / engines) * longest_conversation_s


def run_hours(work: Interval, engines: int, longest_conversation_s: float,
              drain_loss_s: float | None = None, start_loss_s: float | None = None) -> tuple[Interval, Interval]:
    """``(engine-hours, wall-hours)`` from the full-engine work (tokens / tokens/s, in hours).

    engine-hours = work + G × (start + drain);  wall = work / G + start + drain + spread(G).

    ``start_loss_s``: what an engine loses while it fills at a run's start, against its
    settled rate (measured by the probe's first phase; None or 0: nothing added). Like the
    drain it is paid once per engine, whatever the run's length: nothing for a run of days,
    a tenth of a one-minute run (docs/estimate.md, "Start-up and drain").
    """
    start_h = max(0.0, start_loss_s or 0.0) / 3600.0
    drain_h = drain_allowance_s(longest_conversation_s, drain_loss_s) / 3600.0
    spread_h = spread_allowance_s(longest_conversation_s, engines) / 3600.0
    return (work.scaled(1.0, engines * (start_h + drain_h)),
            work.scaled(1.0 / engines, start_h + drain_h + spread_h))


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals: overlapping batches count once."""
    total = 0.0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if end < start:
            continue
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def engine_busy_seconds(batches: Sequence[tuple[str, float, float]]) -> float:
    """Engine time of a run: per worker (one engine each) the union of its batches' intervals, summed.

    ``Σ (finished − started)`` would count a worker's K overlapping batches K times.
    """
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for worker, start, end in batches:
        by_worker.setdefault(worker, []).append((start, end))
    return sum(busy_seconds(v) for v in by_worker.values())
