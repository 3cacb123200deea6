"""How many conversations one engine should run at once, from its KV cache and the run's lengths.

Issue 31: with long answers (thinking traces) one H200 is limited by its KV cache, not by
``max_num_seqs``. vLLM starts a waiting request whenever its *prompt* fits, so with its
default of 1,024 sequences it starts far more than the cache can grow (~150 of the 32B
shape's 1,850-token sequences fit in 275K tokens), then preempts the newest and recomputes
them: prefill work thrown away, again and again. Running no more than the cache holds avoids
that; running fewer than it holds leaves decode bandwidth unused. This module computes the
count; the measurements that chose ``FILL`` are in docs/performance.md ("The seed's regime").

What a conversation in the engine costs the cache over its life is its prompt plus, on
average over the time it runs, half its answer; longer answers run longer, so the mean
over the requests in the engine at a moment is length-biased:
``E[prompt] + E[L^2] / (2 E[L])``. The cache holds ``kv_tokens`` over that many requests.
Before any answer has ended, the run's requested budgets stand in for the lengths: an
upper bound (an answer never exceeds its budget), so the first level errs low, toward no
preemption, never high (worker/engine/kv_level.py then learns the real lengths).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: The share of the KV cache the running sequences are sized to fill on average. Below 1
#: because the sum of ~150 live lengths swings by several percent around its mean, and a
#: swing above the cache preempts.
FILL = 0.9
#: The fewest conversations this sizing ever lets into one engine.
FLOOR = 16


@dataclass(frozen=True)
class LengthMoments:
    """What the sizing needs to know of a workload's lengths, in tokens."""

    prompt_mean: float
    #: E[L] and E[L^2] of the output lengths (or of the budgets, as an upper bound).
    out_mean: float
    out_sq_mean: float
    count: int

    @classmethod
    def of(cls, prompts: Iterable[int], outputs: Iterable[int]) -> LengthMoments:
        p = [int(x) for x in prompts]
        o = [int(x) for x in outputs]
        if not o:
            raise ValueError("no output lengths to size from")
        return cls(prompt_mean=sum(p) / len(p) if p else 0.0, out_mean=sum(o) / len(o),
                   out_sq_mean=sum(x * x for x in o) / len(o), count=len(o))

    def footprint(self) -> float:
        """Tokens of cache a request in the engine holds, averaged over the requests running at a moment."""
        held = self.out_sq_mean / (2.0 * self.out_mean) if self.out_mean > 0 else 0.0
        return max(1.0, self.prompt_mean + held)


def fitting_level(kv_tokens: int, footprint: float, *, default_level: int, fill: float = FILL,
                  per_sequence_tokens: float = 0.0) -> int:
    """Conversations to run at once: what ``fill`` of the cache holds, never above ``default_level``.

    ``per_sequence_tokens``: what a sequence holds beyond its tokens, in the same tokens as ``kv_tokens``
    (a hybrid's recurrent states and its last block's waste: worker/engine/cache_plan.py ``state_tokens``);
    0 for a dense model, whose cache is its tokens alone.

    ``default_level`` is what the engine would run without this sizing (its max_num_seqs,
    or the gate's level): when the cache holds more than that, the cache is not the limit and
    nothing changes. Unknown cache (``kv_tokens`` 0) or footprint: the default.
    """
    if default_level < 1:
        raise ValueError(f"default level must be at least 1, got {default_level}")
    if kv_tokens <= 0 or footprint <= 0:
        return default_level
    fits = math.floor(kv_tokens * fill / (footprint + max(0.0, per_sequence_tokens)))
    return max(min(FLOOR, default_level), min(default_level, fits))
