"""The roofline of decoding: what a step must read and compute, and the rate that allows.

A decode step of a dense model runs two kinds of kernel one after the other. Its GEMMs read every
weight once and do ``2 x parameters`` FLOPs per sequence running; its attention reads the KV cache
of every running sequence once (and does few FLOPs per byte: grouped queries, one token each). So at
``running`` sequences holding ``live_tokens`` of cache in all, a step takes at least

    max(weight_bytes / bandwidth, gemm_flops x running / peak_flops)
  + max(live_tokens x kv_bytes_per_token / bandwidth, attention_flops x live_tokens / peak_flops)

and yields ``running`` tokens. The benchmarks print this next to the measured rate, so a figure is
read against what the GPU allows, not only against bare vLLM.

Why the FLOPs term (added 2026-12-06): until then the bound was the bytes alone, on the belief that
at 100-1,000 sequences decoding is bound by traffic. A kernel profile of the 32B shape on an H200 at
289 running (docs/results/h200-gpu-step-profile-32b-2026-12-06.txt) found its GEMMs taking 29.7 ms a
step where reading the weights takes 13.0 ms: at that batch they do 18.0 TFLOP, 18.2 ms at the
card's 989 TFLOP/s. A GEMM's FLOPs per weight byte equal the batch, and an H200's ridge is 989 /
4.8 = 206: above ~200 running a 32B step is compute-bound, and a bandwidth-only bound overstated
what the card allows there (1.18x at 289 running, 1.39x at 377).

Bandwidth and FLOP/s: the datasheet's figures (dense bf16 tensor FLOP/s, no sparsity) of the card the
run is on (:data:`CARDS`, by the name nvidia-smi gives), 4.8 TB/s and 989 TFLOP/s for the H200. Real
kernels reach 60-90% of them; the bound is the datasheet's, not an achievable target. A card not in
the table gets no bound and its GPU-hours under its own name: a figure printed under another card's
label (an H100 run once printed "at 4.8 TB/s" and "H200-hours") would be a label nobody measured. A
card whose FLOP/s are not in the table gets the bandwidth bound alone, and the line says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from producer.estimate.arithmetic import GPU_BANDWIDTH_TBPS


@dataclass(frozen=True)
class Card:
    """A GPU as the bound needs it: the name its hours are counted in, its datasheet bandwidth and FLOP/s."""

    label: str                 # "H200", "H100 SXM": what "GPU-hours" are printed as
    bandwidth: float | None    # bytes/s; None: not in CARDS, so no bound is printed
    bf16_flops: float | None = None  # dense bf16 tensor FLOP/s; None: the bound is the bandwidth's alone


#: The card the issue's figures are stated on: what a caller that names none means.
H200 = Card("H200", GPU_BANDWIDTH_TBPS["H200"] * 1e12, 989e12)
#: Bytes per second, the H200 SXM's datasheet figure.
H200_BANDWIDTH = H200.bandwidth


#: ``regen estimate --gpu``'s datasheet bandwidths (TB/s, keyed by the names people type): the cards both know
#: take their figure from there, so the bench's bound and the estimate's scaling cannot drift apart.
_TB = {name: tb_s * 1e12 for name, tb_s in GPU_BANDWIDTH_TBPS.items()}
#: nvidia-smi's name (a substring, first match wins: the more specific first) -> the card, with NVIDIA's
#: datasheet memory bandwidth and dense bf16 tensor FLOP/s (the datasheets print twice these "with
#: sparsity"). The lent machines are H200 (4.8 TB/s) and H100 SXM "80GB HBM3" (3.35 TB/s), both 989 TFLOP/s.
CARDS: tuple[tuple[str, Card], ...] = (
    ("GH200", Card("GH200", None)),         # 96 GB HBM3 (4.0 TB/s) or 144 GB HBM3e (4.9 TB/s): the name alone can't tell
    ("H200", H200),
    ("H100 NVL", Card("H100 NVL", 3.9e12, 835e12)),
    ("H100 PCIe", Card("H100 PCIe", 2.0e12, 756e12)),
    ("H100", Card("H100 SXM", _TB["H100"], 989e12)),      # "NVIDIA H100 80GB HBM3"
    ("B200", Card("B200", _TB["B200"], 2250e12)),
    ("A100-SXM4-80GB", Card("A100 SXM 80GB", _TB["A100"], 312e12)),
    ("A100 80GB PCIe", Card("A100 PCIe 80GB", 1.935e12, 312e12)),
    ("A100", Card("A100 40GB", 1.555e12, 312e12)),
    ("L40S", Card("L40S", _TB["L40S"], 362e12)),
    ("RTX PRO 6000", Card("RTX PRO 6000", _TB["RTX-PRO-6000"])),  # its dense bf16 figure: not found in a datasheet
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
CPU_NO_BOUND = "no roofline bound or GPU-hours: a CPU smoke run"
#: bf16.
DTYPE_BYTES = 2


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes, as config.json gives them: dense, or a hybrid whose linear-attention layers keep a
    recurrent state per sequence instead of KV (issue 56: Qwen3.6-27B, worker/engine/cache_plan.py)."""

    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    #: A hybrid's full-attention layers (None: every layer is), the parameters its config gives
    #: (worker/engine/cache_plan.py ``model_params``), and one sequence's recurrent state in bytes.
    attention_layers: int | None = None
    hybrid_params: int | None = None
    state_bytes_per_sequence: int = 0

    @classmethod
    def from_config(cls, model_dir: str | Path) -> Shape:
        from worker.engine.cache_plan import CacheShape, model_params, text_config

        c = text_config(json.loads((Path(model_dir) / "config.json").read_text()))
        cache = CacheShape.from_config(c)
        hybrid = {}
        if cache.hybrid:
            hybrid = {"attention_layers": cache.attention_layers, "hybrid_params": model_params(c),
                      "state_bytes_per_sequence": cache.state_bytes_per_sequence}
        return cls(layers=c["num_hidden_layers"], hidden=c["hidden_size"], intermediate=c["intermediate_size"],
                   q_heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"],
                   head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                   vocab=c["vocab_size"], tied=bool(c.get("tie_word_embeddings", False)), **hybrid)

    @property
    def kv_layers(self) -> int:
        return self.layers if self.attention_layers is None else self.attention_layers

    @property
    def params(self) -> int:
        if self.hybrid_params is not None:
            return self.hybrid_params
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
        return self.kv_layers * self.kv_heads * self.head_dim * 2 * DTYPE_BYTES  # K and V

    @property
    def gemm_flops_per_token(self) -> int:
        """FLOPs of one token through the GEMMs: 2 per weight of the layers' projections and the LM head
        (the input embedding is a lookup, the norms are not GEMMs)."""
        if self.hybrid_params is not None:  # every weight but the input embedding is a GEMM's, to first order
            return 2 * (self.hybrid_params - self.vocab * self.hidden)
        attn = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim + self.q_heads * self.head_dim * self.hidden
        return 2 * (self.layers * (attn + 3 * self.hidden * self.intermediate) + self.vocab * self.hidden)

    @property
    def attention_flops_per_cached_token(self) -> int:
        """FLOPs one decoding query spends on one cached token: Q.K and P.V, 2 x head_dim each, per query
        head and layer."""
        return 4 * self.q_heads * self.head_dim * self.kv_layers

    @property
    def state_bytes_per_step(self) -> int:
        """Bytes of recurrent state one running sequence's decode step moves: each state read, then written."""
        return 2 * self.state_bytes_per_sequence


@dataclass(frozen=True)
class StepFloor:
    """The least time a decode step can take on a card, by kind of kernel (the module's docstring)."""

    gemm_s: float
    attention_s: float
    gemm_compute_bound: bool  # the GEMMs' FLOPs, not the weights' bytes, set gemm_s

    @property
    def seconds(self) -> float:
        return self.gemm_s + self.attention_s

    def tok_s(self, running: float) -> float:
        """Tokens a second at this floor: one a running sequence a step."""
        return running / self.seconds if running > 0 else 0.0


def step_floor(shape: Shape, running: float, live_tokens: float, *, card: Card = H200) -> StepFloor:
    """The step's roofline at ``running`` sequences holding ``live_tokens``: bytes at ``card``'s
    bandwidth, FLOPs at its dense bf16 peak where the table has one."""
    if card.bandwidth is None:
        raise ValueError(f"{card.label}: no bandwidth in bench/gpu/bound.py's CARDS, so no bound")
    weights_s = shape.weight_bytes / card.bandwidth
    # A hybrid's attention-side kernels also read and write each running sequence's recurrent state.
    kv_s = (live_tokens * shape.kv_bytes_per_token + running * shape.state_bytes_per_step) / card.bandwidth
    if card.bf16_flops is None:
        return StepFloor(weights_s, kv_s, False)
    gemm_flops_s = shape.gemm_flops_per_token * running / card.bf16_flops
    attention_flops_s = shape.attention_flops_per_cached_token * live_tokens / card.bf16_flops
    return StepFloor(max(weights_s, gemm_flops_s), max(kv_s, attention_flops_s), gemm_flops_s > weights_s)


def bound_tok_s(shape: Shape, running: float, live_tokens: float, *, card: Card = H200) -> float:
    """Tokens per second the card allows at ``running`` sequences holding ``live_tokens`` in all."""
    return step_floor(shape, running, live_tokens, card=card).tok_s(running)


def bound_line(shape: Shape, running: float, live_tokens: float, measured_tok_s: float,
               *, card: Card = H200) -> str:
    """One line: the step's bytes at the measured concurrency, the bound on ``card``, and the run's share of it."""
    state = (f" + state {running * shape.state_bytes_per_step / 1e9:.1f} GB ({running:.0f} x "
             f"{shape.state_bytes_per_sequence / 2**20:.0f} MiB read and written)" if shape.state_bytes_per_sequence else "")
    reads = (f"weights {shape.weight_bytes / 1e9:.1f} GB + KV {live_tokens * shape.kv_bytes_per_token / 1e9:.1f} GB "
             f"({live_tokens:,.0f} tokens x {shape.kv_bytes_per_token / 1024:.0f} KiB){state} a step at "
             f"{running:.0f} running")
    if card.bandwidth is None:
        return (f"bound: {reads}; no bound: {card.label}'s bandwidth is not in bench/gpu/bound.py's CARDS; "
                f"measured {measured_tok_s:,.0f}")
    floor = step_floor(shape, running, live_tokens, card=card)
    bound = floor.tok_s(running)
    share = f"{measured_tok_s / bound:.0%}" if bound else "-"
    if card.bf16_flops is None:
        peak = f"{card.label}'s {card.bandwidth / 1e12:.2f} TB/s (bandwidth only: its FLOP/s are not in CARDS)"
    else:
        peak = f"{card.label}'s {card.bandwidth / 1e12:.2f} TB/s and {card.bf16_flops / 1e12:,.0f} TFLOP/s"
        if running > 0 and floor.gemm_compute_bound:
            peak += (f" (the GEMMs bound by FLOPs: {shape.gemm_flops_per_token * running / 1e12:.1f} TFLOP a step "
                     f"outweigh the weights' bytes)")
    return f"bound: {reads} -> {bound:,.0f} tok/s at {peak}; measured {measured_tok_s:,.0f} = {share} of it"


#: The seed's corpus: ~1M prompts, ~1.37 B output tokens (issue 31).
SEED_TOKENS = 1.37e9


def seed_hours_line(tok_s: float, *, tokens: float = SEED_TOKENS, card: Card = H200) -> str:
    """The seed's output tokens in GPU-hours of ``card`` (the one the rate was measured on) at ``tok_s`` a GPU."""
    if tok_s <= 0:
        return "seed's corpus: no rate measured"
    return (f"seed's corpus ({tokens / 1e9:.2f} B output tokens) at {tok_s:,.0f} tok/s: "
            f"{tokens / tok_s / 3600:,.0f} {card.label}-hours")
