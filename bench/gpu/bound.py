"""The memory-bandwidth bound of decoding: what a step must read, and the rate that allows.

A decode step of a dense model reads every weight once and the KV cache of every running
sequence once; at the batch sizes of these runs (100-1,000 sequences) it is bound by that
traffic, not by FLOPs. So at ``running`` sequences holding ``live_tokens`` of cache in all,
a step takes at least ``(weight_bytes + live_tokens * kv_bytes_per_token) / bandwidth`` and
yields ``running`` tokens. The benchmarks print this next to the measured rate, so a
figure is read against what the GPU allows, not only against bare vLLM.

Bandwidth: the datasheet's figure of the card the run is on (:data:`CARDS`, by the name nvidia-smi
gives), 4.8 TB/s for the H200. Real kernels reach 80-90% of it; the bound is the datasheet's, not an
achievable target. A card not in the table gets no bound and its GPU-hours under its own name: a
figure printed under another card's label (an H100 run once printed "at 4.8 TB/s" and "H200-hours")
would be a label nobody measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from producer.estimate.arithmetic import GPU_BANDWIDTH_TBPS


@dataclass(frozen=True)
class Card:
    """A GPU as the bound needs it: the name its hours are counted in and its datasheet bandwidth."""

    label: str                 # "H200", "H100 SXM": what "GPU-hours" are printed as
    bandwidth: float | None    # bytes/s; None: not in CARDS, so no bound is printed


#: The card the issue's figures are stated on: what a caller that names none means.
H200 = Card("H200", GPU_BANDWIDTH_TBPS["H200"] * 1e12)
#: Bytes per second, the H200 SXM's datasheet figure.
H200_BANDWIDTH = H200.bandwidth


#: ``regen estimate --gpu``'s datasheet bandwidths (TB/s, keyed by the names people type): the cards both know
#: take their figure from there, so the bench's bound and the estimate's scaling cannot drift apart.
_TB = {name: tb_s * 1e12 for name, tb_s in GPU_BANDWIDTH_TBPS.items()}
#: nvidia-smi's name (a substring, first match wins: the more specific first) -> the card, with NVIDIA's
#: datasheet memory bandwidth. The lent machines are H200 (4.8 TB/s) and H100 SXM "80GB HBM3" (3.35 TB/s).
CARDS: tuple[tuple[str, Card], ...] = (
    ("GH200", Card("GH200", None)),         # 96 GB HBM3 (4.0 TB/s) or 144 GB HBM3e (4.9 TB/s): the name alone can't tell
    ("H200", H200),
    ("H100 NVL", Card("H100 NVL", 3.9e12)),
    ("H100 PCIe", Card("H100 PCIe", 2.0e12)),
    ("H100", Card("H100 SXM", _TB["H100"])),      # "NVIDIA H100 80GB HBM3"
    ("B200", Card("B200", _TB["B200"])),
    ("A100-SXM4-80GB", Card("A100 SXM 80GB", _TB["A100"])),
    ("A100 80GB PCIe", Card("A100 PCIe 80GB", 1.935e12)),
    ("A100", Card("A100 40GB", 1.555e12)),
    ("L40S", Card("L40S", _TB["L40S"])),
    ("RTX PRO 6000", Card("RTX PRO 6000", _TB["RTX-PRO-6000"])),
)


def card_of(name: str) -> Card:
    """The card nvidia-smi calls ``name``; one not in :data:`CARDS` keeps its own name and gets no bandwidth."""
    for key, card in CARDS:
        if key.lower() in name.lower():
            return card
    return Card(name.removeprefix("NVIDIA ").strip() or "unknown GPU", None)


def this_card() -> Card:
    """The first GPU visible here (the benchmarks run on one), or an unknown one where nvidia-smi lists none."""
    from worker.engine.gpu_memory import gpu_cards  # regen's one nvidia-smi query

    cards = gpu_cards()
    return card_of(cards[0].name) if cards and cards[0].name else Card("unknown GPU", None)


#: What a CPU smoke run prints where a GPU run prints the bound and the seed's GPU-hours: a CPU run
#: measures neither.
CPU_NO_BOUND = "no bandwidth bound or GPU-hours: a CPU smoke run"
#: bf16.
DTYPE_BYTES = 2


@dataclass(frozen=True)
class Shape:
    """A dense decoder's sizes, as config.json gives them."""

    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, model_dir: str | Path) -> Shape:
        c = json.loads((Path(model_dir) / "config.json").read_text())
        return cls(layers=c["num_hidden_layers"], hidden=c["hidden_size"], intermediate=c["intermediate_size"],
                   q_heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"],
                   head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                   vocab=c["vocab_size"], tied=bool(c.get("tie_word_embeddings", False)))

    @property
    def params(self) -> int:
        attn = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim + self.q_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden + 2 * self.head_dim  # per layer: two RMSNorms, q/k norms
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * (attn + mlp + norms) + embed + self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.params * DTYPE_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * DTYPE_BYTES  # K and V


def step_bytes(shape: Shape, live_tokens: float) -> float:
    """What one decode step reads: all weights, and the KV of ``live_tokens`` cached tokens."""
    return shape.weight_bytes + live_tokens * shape.kv_bytes_per_token


def bound_tok_s(shape: Shape, running: float, live_tokens: float, *, bandwidth: float = H200_BANDWIDTH) -> float:
    """Tokens per second the bandwidth allows at ``running`` sequences holding ``live_tokens`` in all."""
    if running <= 0:
        return 0.0
    return running * bandwidth / step_bytes(shape, live_tokens)


def bound_line(shape: Shape, running: float, live_tokens: float, measured_tok_s: float,
               *, card: Card = H200) -> str:
    """One line: the step's bytes at the measured concurrency, the bound on ``card``, and the run's share of it."""
    reads = (f"weights {shape.weight_bytes / 1e9:.1f} GB + KV {live_tokens * shape.kv_bytes_per_token / 1e9:.1f} GB "
             f"({live_tokens:,.0f} tokens x {shape.kv_bytes_per_token / 1024:.0f} KiB) a step at {running:.0f} running")
    if card.bandwidth is None:
        return (f"bound: {reads}; no bound: {card.label}'s bandwidth is not in bench/gpu/bound.py's CARDS; "
                f"measured {measured_tok_s:,.0f}")
    bound = bound_tok_s(shape, running, live_tokens, bandwidth=card.bandwidth)
    share = f"{measured_tok_s / bound:.0%}" if bound else "-"
    return (f"bound: {reads} -> {bound:,.0f} tok/s at {card.label}'s {card.bandwidth / 1e12:.2f} TB/s; "
            f"measured {measured_tok_s:,.0f} = {share} of it")


#: The seed's corpus: ~1M prompts, ~1.37 B output tokens (issue 31).
SEED_TOKENS = 1.37e9


def seed_hours_line(tok_s: float, *, tokens: float = SEED_TOKENS, card: Card = H200) -> str:
    """The seed's output tokens in GPU-hours of ``card`` (the one the rate was measured on) at ``tok_s`` a GPU."""
    if tok_s <= 0:
        return "seed's corpus: no rate measured"
    return (f"seed's corpus ({tokens / 1e9:.2f} B output tokens) at {tok_s:,.0f} tok/s: "
            f"{tokens / tok_s / 3600:,.0f} {card.label}-hours")
