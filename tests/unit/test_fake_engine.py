import random

import pytest

from worker.fake_engine import FakeEngineSpec, FakeEngineSpecError


def test_spec_parses_and_multiplies_by_gpus():
    spec = FakeEngineSpec.parse("tok_s=5000, seqs=100,gpus=8")
    assert (spec.tok_s, spec.seqs, spec.gpus, spec.mean) == (5000.0, 100, 8, 1500.0)
    assert spec.max_num_seqs == 800 and spec.seq_tok_s == 50.0


@pytest.mark.parametrize("bad", ["tok_s", "rate=3", "seqs=x", "gpus=0", "tok_s=-1"])
def test_bad_spec_is_refused_with_its_reason(bad):
    with pytest.raises(FakeEngineSpecError, match="--fake-engine"):
        FakeEngineSpec.parse(bad)


def test_lengths_are_long_tailed_around_the_mean_and_capped_by_the_budget():
    spec, rng = FakeEngineSpec(mean=1500, sigma=1.0), random.Random(1)
    lengths = [spec.length(rng, 10**9) for _ in range(20000)]
    assert 1350 < sum(lengths) / len(lengths) < 1650
    assert max(lengths) > 5 * 1500
    assert max(spec.length(rng, 300) for _ in range(1000)) == 300
