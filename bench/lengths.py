"""What a benchmark's workload really was: the output lengths it generated beside the budgets it asked for.

A workload is named by its requested budgets ("lognormal, mean 1,500, cap 8,192"), but
a model that ends its answers early generates something else: on an H200 the dummy-weight
8B model stopped on its own at random, and a "mean 1,500" run averaged 513 tokens (issue
21). Both benchmarks print these lines for every phase, so a figure is never read against
the workload it was not (a CPU run with ``--ignore-eos``, docs/results/throughput-kv-limited-cpu-2026-12-01.txt):

    output lengths requested: mean 566, median 366, p99 2,400, max 2,400
    (a) generated: mean 566, median 366, p99 2,400, max 2,400; 100.0% cut at their budget

A phase that generated under 90% of the requested mean is flagged at the end of its line.

"Cut at their budget" is a request that ended because it reached its ``max_tokens``
(vLLM's finish reason ``length``), not by its own end of sequence.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Lengths:
    count: int
    mean: float
    median: float
    p99: int
    max: int
    #: Share of the requests that ended at their budget (None: not known, e.g. the requested side).
    cut_share: float | None = None

    @classmethod
    def of(cls, lengths: Sequence[int], *, cut: int | None = None) -> Lengths:
        if not lengths:
            raise ValueError("no lengths to describe")
        if cut is not None and not 0 <= cut <= len(lengths):
            raise ValueError(f"{cut} cut at budget out of {len(lengths)} requests")
        return cls(count=len(lengths), mean=statistics.fmean(lengths), median=statistics.median(lengths),
                   p99=percentile(lengths, 0.99), max=max(lengths),
                   cut_share=None if cut is None else cut / len(lengths))

    def describe(self) -> str:
        text = f"mean {self.mean:,.0f}, median {self.median:,.0f}, p99 {self.p99:,}, max {self.max:,}"
        if self.cut_share is not None:
            text += f"; {self.cut_share:.1%} cut at their budget"
        return text


def percentile(values: Sequence[int], q: float) -> int:
    """The nearest-rank percentile: the smallest value with at least ``q`` of the values at or below it."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def distribution_lines(requested: Sequence[int], generated: dict[str, tuple[Sequence[int], int]]) -> list[str]:
    """The requested budgets, then each phase's generated lengths and how many of them were cut at budget."""
    lines = [f"output lengths requested: {Lengths.of(requested).describe()}"]
    width = max((len(label) for label in generated), default=0)
    for label, (lengths, cut) in generated.items():
        got = Lengths.of(lengths, cut=cut)
        note = ""
        if got.mean < 0.9 * statistics.fmean(requested):
            # Not the workload asked for: say so where the figures are read, not only in the docs.
            note = (f"  <- {got.mean / statistics.fmean(requested):.0%} of the requested mean: the model "
                    "ends early (--ignore-eos makes it run to every budget)")
        lines.append(f"({label}){' ' * (width - len(label))} generated: {got.describe()}{note}")
    return lines
