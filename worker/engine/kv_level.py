"""The admission level a KV-cache-limited engine can run without preempting, learned from its answers.

Issue 21: with long answers the KV cache, not ``max_num_seqs``, limits the engine. The
gate's fixed level (1.5 x max_num_seqs) puts up to max_num_seqs sequences into the engine at
once; vLLM admits a waiting request whenever its *prompt* fits, so they all grow until the
cache is full, then it preempts and recomputes them, and runs more sequences than its CUDA
graphs cover, in eager mode. The H200 diagnosis and its figures are in docs/performance.md
and docs/results/h200-gpu-long-diag-2026-12-02.txt. Bare ``LLM.generate`` does the same,
with every request in its queue; the gate is where regen can do better.

What a conversation in the engine costs the cache over its life is its prompt plus, on
average over the time it runs, half its answer; longer answers run longer, so the average
over the requests in the engine at a moment is ``E[prompt] + E[L^2] / (2 E[L])`` (a
length-biased mean: 1.36 x the mean answer for lognormal lengths of sigma 1). The cache
holds ``kv_tokens`` over that many requests; the level is that times ``KV_HEADROOM`` (so
vLLM always has a few waiting to start the moment one ends), never above the default level
(short answers: the cache is not the limit, nothing changes) and never under ``FLOOR``.

The lengths are learned from the generations that ended, with a decay (``HALF_LIFE``
generations) so a run whose answers change is followed. Until ``MIN_SAMPLES`` have ended
the default level holds: nothing is known before the first answers, and answers that end
first are the short ones, so an early estimate errs high (toward the default), never low.
"""

from __future__ import annotations

import math
import os

#: ``REGEN_KV_ADMISSION=1`` turns the learned level on. Off by default: its one H200 run
#: (docs/performance.md, issue 21; figures in docs/results/) cut vLLM's preemptions but did
#: not beat the fixed level; until an A/B on the GPU shows a gain it stays a switch for that
#: A/B, like REGEN_ENGINE_STATS.
KV_ADMISSION_ENV = "REGEN_KV_ADMISSION"


def kv_admission_wanted() -> bool:
    """Whether the engine host should follow the learned level (``REGEN_KV_ADMISSION=1``)."""
    return os.environ.get(KV_ADMISSION_ENV, "").strip() not in ("", "0", "false", "no")

#: The level over what the cache holds: vLLM's own waiting queue, a few requests deep, so a
#: slot freed by an ending request is filled at the next step, not after the worker's loop
#: has handed over the next conversation (milliseconds, but a step is ~10-40 ms).
KV_HEADROOM = 1.1
#: The fewest conversations the gate ever lets into the engine on this estimate.
FLOOR = 16
#: Generations to wait for before the estimate replaces the default level.
MIN_SAMPLES = 64
#: Generations over which an old one's weight halves: a few admission levels' worth.
HALF_LIFE = 2048.0


class KvLevel:
    """Learns the answers' lengths and says how many conversations the engine's KV cache holds."""

    def __init__(self, *, default_level: int, kv_tokens: int):
        if default_level < 1:
            raise ValueError(f"default level must be at least 1, got {default_level}")
        self.default_level = default_level
        self.kv_tokens = max(0, int(kv_tokens))
        self._decay = 0.5 ** (1.0 / HALF_LIFE)
        self._n = 0
        self._w = 0.0      # decayed count
        self._prompt = 0.0  # decayed sums
        self._out = 0.0
        self._out2 = 0.0

    def ended(self, prompt_tokens: int, output_tokens: int) -> None:
        """One generation ended: its prompt and its answer, in tokens."""
        d = self._decay
        self._n += 1
        self._w = self._w * d + 1.0
        self._prompt = self._prompt * d + prompt_tokens
        self._out = self._out * d + output_tokens
        self._out2 = self._out2 * d + float(output_tokens) * output_tokens

    def footprint(self) -> float | None:
        """Tokens of cache an average request in the engine holds; None before ``MIN_SAMPLES``."""
        if self._n < MIN_SAMPLES or self._w <= 0:
            return None
        prompt = self._prompt / self._w
        held = self._out2 / (2.0 * self._out) if self._out > 0 else 0.0
        return max(1.0, prompt + held)

    def level(self) -> int:
        """Conversations to let into the engine at once."""
        foot = self.footprint()
        if foot is None or self.kv_tokens <= 0:
            return self.default_level
        fits = math.ceil(self.kv_tokens / foot * KV_HEADROOM)
        return max(min(FLOOR, self.default_level), min(self.default_level, fits))
