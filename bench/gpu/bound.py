"""The memory-bandwidth bound of decoding: what a step must read, and the rate that allows.

A decode step of a dense model reads every weight once and the KV cache of every running
sequence once; at the batch sizes of these runs (100-1,000 sequences) it is bound by that
traffic, not by FLOPs. So at ``running`` sequences holding ``live_tokens`` of cache in all,
a step takes at least ``(weight_bytes + live_tokens * kv_bytes_per_token) / bandwidth`` and
yields ``running`` tokens. The benchmarks print this next to the measured rate, so a
figure is read against what the GPU allows, not only against bare vLLM.

Bandwidth: the H200's published 4.8 TB/s (HBM3e). Real kernels reach 80-90% of it; the bound
is the datasheet's, not an achievable target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: Bytes per second, the H200 SXM's datasheet figure.
H200_BANDWIDTH = 4.8e12
#: What a CPU smoke run prints where a GPU run prints the bound and the seed's H200-hours: both are an
#: H200's figures, and a CPU run measures neither.
CPU_NO_BOUND = "no H200 bound or H200-hours: a CPU smoke run"
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
               *, bandwidth: float = H200_BANDWIDTH) -> str:
    """One line: the step's bytes at the measured concurrency, the bound, and the run's share of it."""
    bound = bound_tok_s(shape, running, live_tokens, bandwidth=bandwidth)
    share = f"{measured_tok_s / bound:.0%}" if bound else "-"
    return (f"bound: weights {shape.weight_bytes / 1e9:.1f} GB + KV {live_tokens * shape.kv_bytes_per_token / 1e9:.1f} GB "
            f"({live_tokens:,.0f} tokens x {shape.kv_bytes_per_token / 1024:.0f} KiB) a step at {running:.0f} running "
            f"-> {bound:,.0f} tok/s at {bandwidth / 1e12:.1f} TB/s; measured {measured_tok_s:,.0f} = {share} of it")


#: The seed's corpus: ~1M prompts, ~1.37 B output tokens (issue 31).
SEED_TOKENS = 1.37e9


def seed_hours_line(tok_s: float, *, tokens: float = SEED_TOKENS) -> str:
    """The seed's output tokens in H200-hours at ``tok_s`` a GPU."""
    if tok_s <= 0:
        return "seed's corpus: no rate measured"
    return f"seed's corpus ({tokens / 1e9:.2f} B output tokens) at {tok_s:,.0f} tok/s: {tokens / tok_s / 3600:,.0f} H200-hours"
