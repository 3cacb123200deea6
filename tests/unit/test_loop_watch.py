"""The loop watch says, at every length, what the quality classifier says of a completion ending there."""

from __future__ import annotations

import random
import time

import pytest

from ledger.quality import Thresholds, repetition_share
from worker.engine.loop_watch import LoopWatch

T = Thresholds()


def _looping(rng: random.Random, prefix: int, period: int, length: int) -> list[int]:
    head = [rng.randrange(1000) for _ in range(prefix)]
    cycle = [rng.randrange(1000) for _ in range(period)]
    return head + [cycle[k % period] for k in range(length - prefix)]


@pytest.mark.parametrize("seed", range(4))
def test_its_verdict_and_share_equal_the_classifiers_at_every_chunk_end(seed):
    rng = random.Random(seed)
    ids = _looping(rng, prefix=rng.randrange(100, 900), period=rng.randrange(15, 80), length=1500)
    watch = LoopWatch(T.repetition_ngram, T.repetition_min_tokens, T.repetition_max_share)
    at = 0
    while at < len(ids):
        step = rng.randrange(1, 70)
        verdict = watch.feed(ids[at:at + step])
        at = min(len(ids), at + step)
        share = repetition_share(ids[:at], T.repetition_ngram, T.repetition_min_tokens)
        assert verdict == (share > T.repetition_max_share), at
        if at >= T.repetition_min_tokens:
            assert watch.share == pytest.approx(share), at


def test_a_completion_that_never_repeats_is_never_a_loop():
    watch = LoopWatch(T.repetition_ngram, T.repetition_min_tokens, T.repetition_max_share)
    rng = random.Random(7)
    assert not any(watch.feed([rng.randrange(50_000)]) for _ in range(5000))


def test_a_loop_is_caught_soon_after_it_fills_half_the_completion():
    rng = random.Random(3)
    ids = _looping(rng, prefix=300, period=40, length=4000)
    watch = LoopWatch(T.repetition_ngram, T.repetition_min_tokens, T.repetition_max_share)
    stop = next(n for n in range(1, len(ids) + 1) if watch.feed(ids[n - 1:n]))
    # The loop's repeats (from ~340: the prefix and one period) fill half of the second half at ~455 tokens.
    assert 450 <= stop <= 500, stop


def test_its_cost_per_token_stays_small_at_the_end_of_a_long_completion():
    """Incremental: the last 8,192 of 32,768 ids cost about a microsecond each (20 us allowed, for a loaded
    machine); a rescan of the completion at each 64-id chunk, as the classifier computes it, costs ~50 us a token
    there (its ~3 ms for 32K ids, every 64 ids)."""
    rng = random.Random(1)
    ids = [rng.randrange(50_000) for _ in range(32_768)]

    def last_block_seconds() -> float:
        watch = LoopWatch(T.repetition_ngram, T.repetition_min_tokens, T.repetition_max_share)
        watch.feed(ids[:24_576])
        start = time.perf_counter()
        for k in range(24_576, 32_768, 64):
            watch.feed(ids[k:k + 64])
        return time.perf_counter() - start

    assert min(last_block_seconds() for _ in range(3)) / 8192 < 20e-6, "more than 20 us a token"

def test_a_run_records_stop_loops_only_when_off(tmp_path):
    from producer.run_config import build_run_config
    from tests.support.model_folder import write_model_folder

    model = str(write_model_folder(tmp_path / "m"))
    on = build_run_config(model, max_tokens=8)
    off = build_run_config(model, max_tokens=8, stop_loops="off")
    assert "stop_loops" not in on.as_record() and off.as_record()["stop_loops"] == "off"
    assert on.hash != off.hash
