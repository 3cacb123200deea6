import asyncio
import random

import pytest

from worker.engine.fake import FakeEngineSpec, FakeEngineSpecError, SharedDecode


def test_spec_parses_and_multiplies_by_gpus():
    spec = FakeEngineSpec.parse("tok_s=5000, seqs=100,gpus=8")
    assert (spec.tok_s, spec.seqs, spec.gpus, spec.mean) == (5000.0, 100, 8, 1500.0)
    assert spec.max_num_seqs == 800 and spec.seq_tok_s == 50.0


@pytest.mark.parametrize("bad", ["tok_s", "rate=3", "seqs=x", "gpus=0", "tok_s=-1", "solo=0.5"])
def test_bad_spec_is_refused_with_its_reason(bad):
    with pytest.raises(FakeEngineSpecError, match="--fake-engine"):
        FakeEngineSpec.parse(bad)


def test_lengths_are_long_tailed_around_the_mean_and_capped_by_the_budget():
    spec, rng = FakeEngineSpec(mean=1500, sigma=1.0), random.Random(1)
    lengths = [spec.length(rng, 10**9) for _ in range(20000)]
    assert 1350 < sum(lengths) / len(lengths) < 1650
    assert max(lengths) > 5 * 1500
    assert max(spec.length(rng, 300) for _ in range(1000)) == 300


def _elapsed(spec: FakeEngineSpec, lengths: list[int]) -> float:
    async def go() -> float:
        decode = SharedDecode(spec)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.gather(*(decode.run(n) for n in lengths))
        return loop.time() - start
    return asyncio.run(go())


def test_a_full_fake_engine_shares_its_rate_and_a_lone_sequence_goes_solo_times_faster():
    spec = FakeEngineSpec(tok_s=1000, seqs=10, solo=4)  # 100 tok/s per sequence when full
    assert _elapsed(spec, [40] * 10) == pytest.approx(0.4, abs=0.05)
    assert _elapsed(spec, [40]) == pytest.approx(0.1, abs=0.03)
    # solo=1: a fixed rate per sequence, however few run.
    assert _elapsed(FakeEngineSpec(tok_s=1000, seqs=10), [40]) == pytest.approx(0.4, abs=0.05)


def test_a_short_sequence_ends_first_and_the_rest_speed_up():
    spec = FakeEngineSpec(tok_s=1000, seqs=10, solo=10)
    # Two sequences share 1,000 tok/s (500 each, under the 1,000 cap): the 50-token one ends at 0.1 s,
    # then the other runs alone at 1,000 tok/s: its last 150 tokens take 0.15 s.
    assert _elapsed(spec, [50, 200]) == pytest.approx(0.25, abs=0.04)


def test_a_cancelled_sequence_gives_its_share_back():
    async def go() -> float:
        decode = SharedDecode(FakeEngineSpec(tok_s=1000, seqs=10, solo=10))
        loop = asyncio.get_running_loop()
        start = loop.time()
        doomed = asyncio.ensure_future(decode.run(10_000))
        kept = asyncio.ensure_future(decode.run(200))
        await asyncio.sleep(0.1)  # both at 500 tok/s: 50 tokens of the kept one made
        doomed.cancel()
        await kept  # the last 150 alone at 1,000 tok/s
        return loop.time() - start
    assert asyncio.run(go()) == pytest.approx(0.25, abs=0.04)

