"""The admission level a KV-cache-limited engine runs without preempting: from the requests and their answers.

Issue 21 found, and issue 31 measured on a 32B shape: with long answers the KV cache, not
``max_num_seqs``, limits the engine. vLLM starts a waiting request whenever its *prompt*
fits, so with 1,024 sequences allowed it starts far more than the cache can grow, then
preempts and recomputes them. The gate (worker/engine/admission.py) decides how many
conversations are in the engine at all; this module says how many the cache holds, and
worker/engine/sizing.py turns that into a level (``FILL`` of the cache, never above the
default level, so short answers change nothing).

What a request holds of the cache, averaged over the requests in the engine at a moment, is
``E[prompt] + E[L^2] / (2 E[L])`` (length-biased: long answers run long). Two things are
known of ``L``:

- **its budget** ``B``, the moment the request enters the engine (``asked``): the run's
  ``max_tokens``, or the sample's own, or what ``max_model_len`` leaves; an answer never
  exceeds it. With no answer ended yet, the lengths are taken to be the budgets: the level
  errs low (no preemption), never high, and when every answer runs to its budget (a
  benchmark with ``ignore_eos``, or thinking traces cut at the cap) it is exact at once.
- **the share of its budget an answer used** ``r = L / B``, once ``MIN_SAMPLES`` have ended.
  Then ``E[L^2] / 2E[L] = E[B^2] E[r^2] / (2 E[B] E[r])`` (r taken independent of B). The
  share, not the length, is learned because the first answers to end are the short ones:
  their lengths would say the cache holds far more than it does, while a run whose answers
  all hit their budget reads ``r = 1`` from its very first answer.

Both are decayed (``HALF_LIFE`` requests), so a run whose prompts or answers change is followed.
"""

from __future__ import annotations

import os

from worker.engine.sizing import FILL, fitting_level

#: ``REGEN_KV_ADMISSION=1`` turns the sizing on. Off by default: on the H200 (issue 31) a 32B
#: engine capped at what its cache holds ran 8-11% slower than vLLM 0.26's defaults on a burst too
#: small to fill the cache (docs/results/h200-gpu-sweep-2026-12-02.txt), and 1.08x them in the
#: steady state where the cache is the limit, inside the 18% spread of the defaults themselves
#: (docs/results/h200-gpu-steady-2026-12-03.txt), where a 1% admission watermark (the GPU
#: default now, worker/engine/host.py) did better. It stays a switch for an A/B, like REGEN_ENGINE_STATS.
KV_ADMISSION_ENV = "REGEN_KV_ADMISSION"


def kv_admission_wanted() -> bool:
    """Whether the engine host sizes its level from the KV cache (``REGEN_KV_ADMISSION=1``)."""
    return os.environ.get(KV_ADMISSION_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


#: Requests to see enter the engine before the budgets are trusted to describe the run.
MIN_ASKED = 16
#: Answers to see end before their share of the budget replaces "all of it".
MIN_SAMPLES = 64
#: Requests over which an old one's weight halves: a few admission levels' worth.
HALF_LIFE = 2048.0


class _Decayed:
    """Exponentially decayed sums of a few quantities."""

    def __init__(self, n: int):
        self._decay = 0.5 ** (1.0 / HALF_LIFE)
        self.count = 0
        self.weight = 0.0
        self.sums = [0.0] * n

    def add(self, *values: float) -> None:
        d = self._decay
        self.count += 1
        self.weight = self.weight * d + 1.0
        self.sums = [s * d + v for s, v in zip(self.sums, values, strict=True)]

    def mean(self, i: int) -> float:
        return self.sums[i] / self.weight if self.weight > 0 else 0.0


class KvLevel:
    """Learns the requests' budgets and the answers' share of them; says how many requests the cache holds."""

    def __init__(self, *, default_level: int, kv_tokens: int, fill: float = FILL, per_sequence_tokens: float = 0.0):
        if default_level < 1:
            raise ValueError(f"default level must be at least 1, got {default_level}")
        self.default_level = default_level
        self.kv_tokens = max(0, int(kv_tokens))
        self.fill = fill
        #: A hybrid's states, in tokens of ``kv_tokens``: what each request holds beyond its tokens (issue 56).
        self.per_sequence_tokens = max(0.0, float(per_sequence_tokens))
        self._asked = _Decayed(3)  # prompt, budget, budget^2
        self._used = _Decayed(2)   # r, r^2

    def asked(self, prompt_tokens: int, budget: int) -> None:
        """A request entered the engine: its prompt and its output budget, in tokens."""
        b = max(1, int(budget))
        self._asked.add(prompt_tokens, b, float(b) * b)

    def ended(self, prompt_tokens: int, output_tokens: int, budget: int | None = None) -> None:
        """A request ended: its answer's length against its budget (None: the answer is taken as its budget)."""
        r = 1.0 if not budget else min(1.0, output_tokens / max(1, int(budget)))
        self._used.add(r, r * r)

    def share_of_budget(self) -> tuple[float, float]:
        """``(E[r], E[r^2])`` of the answers' share of their budgets; (1, 1) until ``MIN_SAMPLES`` ended."""
        if self._used.count < MIN_SAMPLES:
            return 1.0, 1.0
        return max(1e-6, self._used.mean(0)), max(1e-12, self._used.mean(1))

    def footprint(self) -> float | None:
        """Tokens of cache an average request in the engine holds; None before ``MIN_ASKED`` requests."""
        if self._asked.count < MIN_ASKED:
            return None
        prompt, budget, budget_sq = (self._asked.mean(i) for i in range(3))
        r, r_sq = self.share_of_budget()
        held = budget_sq * r_sq / (2.0 * budget * r) if budget > 0 else 0.0
        return max(1.0, prompt + held)

    def level(self) -> int:
        """Conversations to let into the engine at once."""
        foot = self.footprint()
        if foot is None:
            return self.default_level
        return fitting_level(self.kv_tokens, foot, default_level=self.default_level, fill=self.fill,
                             per_sequence_tokens=self.per_sequence_tokens)

    def describe(self) -> str:
        """What the level rests on, for the worker's log and the run's provenance."""
        foot = self.footprint()
        r, _ = self.share_of_budget()
        if foot is None:
            return f"KV cache {self.kv_tokens:,} tokens; level {self.default_level} until {MIN_ASKED} requests are seen"
        state = f" + {self.per_sequence_tokens:,.0f} of state" if self.per_sequence_tokens else ""
        return (f"KV cache {self.kv_tokens:,} tokens at {self.fill:.0%} / ~{foot:,.0f} tokens{state} a request "
                f"(answers use {r:.0%} of their budgets) = level {self.level()}")
