"""Loops caught while they are generated: ledger/quality.py's repetition criterion, kept up token by token.

A thinking model that loops runs to ``max_tokens`` (32,768 in Qwen3.6 regeneration profiles): at 2% of samples
looping, that is as many tokens as ~40% of a 1,500-token-mean corpus, spent on rows the quality classifier
throws out afterwards (``repetition_loop``). ``LoopWatch`` holds, for the completion so far, what that classifier
computes over the whole of it (``repetition_share``: the share of ``ngram``-grams that occurred earlier, over the
whole completion and over its second half), updated in O(1) per token: a rolling 64-bit hash of the last
``ngram`` ids, the set of hashes seen, and the running count of windows already seen (a prefix sum, so the second
half's count at any length is one subtraction). No rescan: its per-token cost is a multiply, a set lookup and an
append (about a microsecond in CPython). At any length it says exactly what the classifier would say of a
completion that ended there, so a stopped sample is classified ``repetition_loop`` by the same rule.

Memory: one set entry and one list slot per token of the completion (tens of bytes each).
"""

from __future__ import annotations

from collections import deque

_MASK = (1 << 64) - 1
#: The finish reason of a generation stopped as a loop (worker/conversation/dialogue.py ends the conversation there).
LOOP_FINISH = "repetition_loop"
#: How often a watched request's ids come back from vLLM (its per-request ``stream_interval``): a loop is caught
#: at most this many tokens late, and the engine's frontend builds one output per this many tokens, not per token.
LOOP_STREAM_TOKENS = 64
#: The classifier's multiplier (ledger/quality.py repetition_share): odd, so no two windows collide by construction.
_MULTIPLIER = 0x9E3779B97F4A7C15


class LoopWatch:
    """One completion's repetition, kept up as its ids arrive; ``loops`` once it meets the classifier's criterion."""

    def __init__(self, ngram: int, min_tokens: int, max_share: float):
        if ngram < 2:
            raise ValueError("ngram must be >= 2")
        self.ngram = ngram
        self.min_tokens = max(min_tokens, 2 * ngram)
        self.max_share = max_share
        self.length = 0
        self._window: deque[int] = deque()     # the last ngram ids (+1), oldest first
        self._hash = 0
        self._drop = pow(_MULTIPLIER, ngram - 1, 1 << 64)   # weight of the oldest id in the window
        self._seen: set[int] = set()
        #: _repeats[k]: windows among the first k that occurred earlier (a prefix sum over window positions).
        self._repeats = [0]
        self.share = 0.0

    def feed(self, token_ids) -> bool:
        """Add the completion's next ids; True when the completion so far is a loop (and stays True after)."""
        window, seen, repeats, ngram = self._window, self._seen, self._repeats, self.ngram
        h = self._hash
        for token in token_ids:
            value = token + 1
            if len(window) == ngram:
                h = (h - window.popleft() * self._drop) & _MASK
            window.append(value)
            h = (h * _MULTIPLIER + value) & _MASK
            if len(window) == ngram:
                repeated = h in seen
                if not repeated:
                    seen.add(h)
                repeats.append(repeats[-1] + repeated)
        self._hash = h
        self.length += len(token_ids)
        return self.loops()

    def loops(self) -> bool:
        """The classifier's verdict on the completion so far (ledger/quality.py repetition_share > max_share)."""
        if self.length < self.min_tokens:
            return False
        windows = len(self._repeats) - 1
        half = windows // 2
        whole = self._repeats[windows] / windows
        second = (self._repeats[windows] - self._repeats[half]) / (windows - half)
        self.share = max(whole, second)
        return self.share > self.max_share


def stream_every(sampling_params_class) -> dict:
    """``stream_interval=LOOP_STREAM_TOKENS`` where this vLLM's SamplingParams has it (0.32 does); else nothing:
    every token comes back (correct, with more work for the engine's frontend)."""
    fields = getattr(sampling_params_class, "__struct_fields__", None) or getattr(
        sampling_params_class, "__dataclass_fields__", {})
    return {"stream_interval": LOOP_STREAM_TOKENS} if "stream_interval" in fields else {}


async def follow(stream, watch: LoopWatch) -> tuple[object | None, list[int], bool]:
    """Read a request's DELTA outputs (vLLM's ``AsyncLLM.generate``), feeding each one's new ids to ``watch``.

    Returns:
        (the last output, the completion's ids, whether it was stopped as a loop). A loop closes the stream, and
        vLLM aborts the request there (``AsyncLLM.generate`` aborts on ``GeneratorExit``).
    """
    final, token_ids = None, []
    async for out in stream:
        final = out
        delta = out.outputs[0].token_ids
        token_ids.extend(delta)
        if not out.finished and watch.feed(delta):
            await stream.aclose()
            return final, token_ids, True
    return final, token_ids, False
