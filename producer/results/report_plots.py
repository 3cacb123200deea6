"""The report's PNG plots (matplotlib, Agg backend: no display, safe in threads and on servers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ledger.quality import CLASSES

#: Loss-mask size under which a sample teaches a drafter almost nothing; marked on the plot.
TINY_LOSS_TOKENS = 16
_CLASS_COLORS = {
    "ok": "#2e7d32", "failed": "#424242", "empty_answer": "#b71c1c", "stub_answer": "#e53935",
    "repetition_loop": "#8e24aa", "empty_reasoning": "#fb8c00", "truncated_reasoning": "#1565c0",
    "truncated_answer": "#42a5f5", "bad_think_tags": "#6d4c41", "unoffered_tool": "#00897b",
    "invalid_tool_json": "#fdd835", "tool_args_differ": "#26a69a",
    "unclassified": "#bdbdbd",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _array(values: Sequence[int]):
    import numpy as np

    return np.asarray(values, dtype=np.int64)


def _log_bins(values, count: int = 50):
    import numpy as np

    top = max(int(values.max()) if len(values) else 0, 1)
    # 0 gets its own bin [0, 1); then log-spaced bins up to the largest value.
    return np.concatenate([[0.0], np.geomspace(1.0, top + 1.0, count)])


def loss_mask_histogram(values: Sequence[int], path: Path) -> Path:
    """Loss-mask tokens per sample on log axes: a pile of 6-token stubs shows as a spike at the left."""
    plt = _pyplot()
    values = _array(values)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if len(values):
        ax.hist(values, bins=_log_bins(values), color="#1565c0")
        ax.set_xscale("symlog", linthresh=1.0)
        if len(values) > 100:  # log counts once a few bins hold thousands and others a handful
            ax.set_yscale("log")
            _plain_counts(ax.yaxis)
        tiny = int((values < TINY_LOSS_TOKENS).sum())
        ax.axvline(TINY_LOSS_TOKENS, color="#e53935", linestyle="--")
        ax.set_title(f"loss-mask tokens per sample ({len(values):,} done samples; "
                     f"{tiny / len(values):.1%} under {TINY_LOSS_TOKENS} tokens)")
    else:
        ax.set_title("loss-mask tokens per sample: no done sample yet")
    ax.set_xlabel("trainable (completion) tokens per sample, log scale")
    ax.set_ylabel("samples" + (", log scale" if len(values) > 100 else ""))
    return _save(fig, plt, path)


def length_histograms(reasoning: Sequence[int], answer: Sequence[int], path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, values, name, color in ((axes[0], reasoning, "reasoning", "#fb8c00"),
                                    (axes[1], answer, "answer", "#2e7d32")):
        values = _array(values)
        if len(values):
            ax.hist(values, bins=_log_bins(values), color=color)
            ax.set_xscale("symlog", linthresh=1.0)
        ax.set_title(f"{name} tokens per sample ({len(values):,} samples)")
        ax.set_xlabel("tokens, log scale")
        ax.set_ylabel("samples")
    return _save(fig, plt, path)


def bar_chart(counts: Mapping[str, int], path: Path, title: str, *, colored_by_class: bool = False) -> Path:
    plt = _pyplot()
    labels = list(counts)
    total = sum(counts.values()) or 1
    fig, ax = plt.subplots(figsize=(9, 0.45 * max(3, len(labels)) + 1.2))
    colors = [_CLASS_COLORS.get(label, "#757575") for label in labels] if colored_by_class else "#1565c0"
    ax.barh(labels, [counts[k] for k in labels], color=colors)
    for n, label in enumerate(labels):
        ax.text(counts[label], n, f" {counts[label]:,} ({counts[label] / total:.1%})", va="center")
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel("count")
    ax.margins(x=0.25)
    return _save(fig, plt, path)


def sources_chart(per_source: Mapping[str, Mapping[str, int]], path: Path, limit: int = 25) -> Path:
    """Share of each quality class per source file (the largest ``limit`` files)."""
    plt = _pyplot()
    files = sorted(per_source, key=lambda f: (-sum(per_source[f].values()), f))[:limit]
    classes = [c for c in (*CLASSES, "unclassified") if any(per_source[f].get(c) for f in files)]
    fig, ax = plt.subplots(figsize=(10, 0.45 * max(3, len(files)) + 1.5))
    left = [0.0] * len(files)
    for name in classes:
        shares = [per_source[f].get(name, 0) / max(1, sum(per_source[f].values())) for f in files]
        ax.barh(files, shares, left=left, color=_CLASS_COLORS.get(name, "#757575"), label=name)
        left = [a + b for a, b in zip(left, shares, strict=True)]
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the file's committed samples")
    ax.set_title(f"quality classes per source file ({len(files)} of {len(per_source)} files)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    return _save(fig, plt, path)


def _plain_counts(axis) -> None:
    """Counts as 1, 10, 1,000 on a log axis, not 10^0 and 6x10^0."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axis.set_minor_formatter(NullFormatter())


def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout()
    # "tight": legends placed outside the axes stay in the picture.
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path
