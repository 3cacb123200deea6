"""How much of its GPU the engine may take: more than vLLM's share when the card is the worker's alone.

vLLM's ``gpu_memory_utilization`` (0.92 in 0.26, 0.9 before) is the share of the card's *total*
memory its engine budgets for weights, activations and KV cache, sized for a card that other
processes may share. A regen worker is GPU-pinned: on a card that is empty when its engine starts,
that engine is the card's only tenant, and every GiB vLLM leaves out is a GiB of KV cache lost.
Where the cache is the limit (long answers: the seed's regime) more cache is more sequences per
decode step for the same weight read: on an H200 at the 32B shape, 0.95 gave the cache 6.2% more
tokens than 0.92 (292,432 vs 275,264), ran two steady-state benchmarks of 9-11 minutes without a
fault, and with the admission watermark output 1.22x vLLM's defaults
(docs/results/h200-gpu-steady-2026-12-03b.txt).

The rule, per visible card: nvidia-smi shows at most ``EMPTY_MIB`` in use (the driver's own) and the
card has at least ``BIG_GIB`` (where 5% is >= 3.5 GiB outside vLLM's budget, the headroom an H200
kept at 0.95: 7 GiB): ``SHARE_ALONE``. Anything else (a card in use, a small card, nvidia-smi
missing): nothing is set and vLLM's default stands, so a node that shares its GPUs starts as before.
The user's ``--engine-arg gpu_memory_utilization=...`` always wins (worker/engine/host.py).
"""

from __future__ import annotations

import os
import subprocess
from typing import NamedTuple

#: The share asked for on a card the engine has to itself.
SHARE_ALONE = 0.95
#: Memory in use on a card that counts as empty: the driver's and the display's few hundred MiB.
EMPTY_MIB = 1024
#: Cards smaller than this keep vLLM's default: 5% of them is too little headroom to have been seen to hold.
BIG_GIB = 70


class Card(NamedTuple):
    """One GPU as nvidia-smi reports it: what the engine's share and vLLM's batch defaults depend on."""

    total_mib: float
    used_mib: float
    name: str = ""


def gpu_cards(cuda_visible: str | None = None) -> list[Card] | None:
    """Each visible card, read by one nvidia-smi query; None where it cannot tell.

    The one place regen asks the driver about its cards: the share of the card (below) and the
    max_num_seqs vLLM will pick (worker/engine/host.py) both read it, and the benchmarks' bound its card
    (bench/gpu/bound.py ``this_card``).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if cuda_visible is None else cuda_visible
    query = ["nvidia-smi", "--query-gpu=memory.total,memory.used,name", "--format=csv,noheader,nounits"]
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if not ids:
            return None
        query[1:1] = ["-i", ",".join(ids)]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        cards = []
        for line in out.strip().splitlines():
            if line.strip():
                total, used, *name = (x.strip() for x in line.split(",", 2))
                cards.append(Card(float(total), float(used), name[0] if name else ""))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return cards or None


def memory_share(cards: list[Card] | list[tuple[float, float]] | None) -> dict[str, float]:
    """``{"gpu_memory_utilization": SHARE_ALONE}`` when every card is big and empty, else ``{}`` (vLLM's)."""
    if not cards:
        return {}
    if all(card[0] >= BIG_GIB * 1024 and card[1] <= EMPTY_MIB for card in cards):
        return {"gpu_memory_utilization": SHARE_ALONE}
    return {}
