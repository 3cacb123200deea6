"""The admission level a KV-cache-limited engine holds (worker/engine/kv_level.py), and the gate following it."""

import asyncio

import pytest

from worker.engine.admission import AdmissionGate
from worker.engine.kv_level import FLOOR, KV_HEADROOM, MIN_SAMPLES, KvLevel


def test_the_default_level_holds_until_enough_answers_have_ended():
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    for _ in range(MIN_SAMPLES - 1):
        kv.ended(100, 4000)
    assert kv.footprint() is None
    assert kv.level() == 1536
    kv.ended(100, 4000)
    assert kv.level() < 1536


def test_long_answers_bring_the_level_down_to_what_the_cache_holds():
    # Every answer 1,500 tokens after a 100-token prompt: a request holds 100 + 750 on average.
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    for _ in range(500):
        kv.ended(100, 1500)
    assert kv.footprint() == pytest.approx(850)
    assert kv.level() == pytest.approx(829_136 / 850 * KV_HEADROOM, abs=1)


def test_longer_answers_weigh_more_than_their_share():
    # Half the answers 100 tokens, half 2,900: mean 1,500, but a request in the engine is
    # more often a long one: E[L^2] / (2 E[L]) = (100^2 + 2900^2) / 2 / 3000 = 1403.
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    for _ in range(300):
        kv.ended(0, 100)
        kv.ended(0, 2900)
    assert kv.footprint() == pytest.approx(1403.3, abs=1)


def test_short_answers_leave_the_default_level():
    # The 20-round workload's shape: 100-token answers, where max_num_seqs is the limit.
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    for _ in range(5000):
        kv.ended(150, 100)
    assert kv.level() == 1536


def test_an_unknown_cache_leaves_the_default_and_the_floor_bounds_it():
    unknown = KvLevel(default_level=384, kv_tokens=0)
    tiny = KvLevel(default_level=384, kv_tokens=1000)
    for _ in range(MIN_SAMPLES):
        unknown.ended(100, 8000)
        tiny.ended(100, 8000)
    assert unknown.level() == 384
    assert tiny.level() == FLOOR


def test_the_estimate_follows_a_run_whose_answers_change():
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    for _ in range(2000):
        kv.ended(100, 100)
    assert kv.level() == 1536
    for _ in range(16000):
        kv.ended(100, 3000)
    # 100 + 3000 / 2 tokens a request once the short answers have decayed away: ~570 requests.
    assert kv.level() == pytest.approx(829_136 / 1600 * KV_HEADROOM, rel=0.02)


def test_a_raised_level_lets_waiters_in_and_a_lowered_one_evicts_nobody():
    async def scenario():
        gate = AdmissionGate(2)
        entered = []

        async def conversation(i):
            await gate.acquire((0, i))
            entered.append(i)

        tasks = [asyncio.ensure_future(conversation(i)) for i in range(5)]
        await asyncio.sleep(0)
        assert entered == [0, 1]
        gate.set_level(4)
        await asyncio.sleep(0)
        assert entered == [0, 1, 2, 3]
        gate.set_level(1)
        assert gate.admitted == 4  # nobody is evicted
        for _ in range(3):
            gate.release()
        await asyncio.sleep(0)
        assert entered == [0, 1, 2, 3]  # 1 admitted, level 1: the fifth still waits
        gate.release()
        await asyncio.sleep(0)
        assert entered == [0, 1, 2, 3, 4]
        await asyncio.gather(*tasks)
        with pytest.raises(ValueError, match="at least 1"):
            gate.set_level(0)

    asyncio.run(scenario())


def test_the_learned_level_is_off_unless_asked_for(monkeypatch):
    from worker.engine.kv_level import KV_ADMISSION_ENV, kv_admission_wanted

    monkeypatch.delenv(KV_ADMISSION_ENV, raising=False)
    assert not kv_admission_wanted()
    monkeypatch.setenv(KV_ADMISSION_ENV, "1")
    assert kv_admission_wanted()
    monkeypatch.setenv(KV_ADMISSION_ENV, "0")
    assert not kv_admission_wanted()
