"""The admission level a KV-cache-limited engine holds (worker/engine/kv_level.py), and the gate following it."""

import asyncio

import pytest

from worker.engine.admission import AdmissionGate
from worker.engine.kv_level import MIN_ASKED, MIN_SAMPLES, KvLevel
from worker.engine.sizing import FILL, FLOOR


def _asked(kv, n, prompt, budget):
    for _ in range(n):
        kv.asked(prompt, budget)


def test_the_default_level_holds_until_enough_requests_have_been_seen():
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    _asked(kv, MIN_ASKED - 1, 100, 4000)
    assert kv.footprint() is None
    assert kv.level() == 1536
    kv.asked(100, 4000)
    assert kv.level() < 1536


def test_budgets_alone_size_the_level_before_any_answer_ends():
    # Every budget 1,500 after a 100-token prompt: a request holds 100 + 750 on average, at most.
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    _asked(kv, 500, 100, 1500)
    assert kv.footprint() == pytest.approx(850)
    assert kv.level() == int(829_136 * FILL / 850)


def test_longer_budgets_weigh_more_than_their_share():
    # Half the budgets 100 tokens, half 2,900: mean 1,500, but a request in the engine is
    # more often a long one: E[B^2] / (2 E[B]) = (100^2 + 2900^2) / 2 / 3000 = 1403.
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    for _ in range(300):
        kv.asked(0, 100)
        kv.asked(0, 2900)
    assert kv.footprint() == pytest.approx(1403.3, abs=1)


def test_answers_shorter_than_their_budgets_raise_the_level_once_enough_have_ended():
    # The seed's shape: every budget 32K, answers ~1,500. Budgets alone: the floor-ish level.
    kv = KvLevel(default_level=1536, kv_tokens=275_000)
    _asked(kv, 200, 100, 32768)
    before = kv.level()
    assert before == max(FLOOR, int(275_000 * FILL / (100 + 16384)))
    for _ in range(MIN_SAMPLES - 1):
        kv.ended(100, 1500, 32768)
    assert kv.level() == before  # too few answers yet
    kv.ended(100, 1500, 32768)
    assert kv.footprint() == pytest.approx(100 + 750, rel=1e-6)
    assert kv.level() == int(275_000 * FILL / 850)


def test_answers_at_their_budget_keep_the_level_however_short_the_first_ones_are():
    # The first answers to end are the short budgets; each used all of its budget (r = 1), so
    # nothing says the cache holds more than the budgets say.
    kv = KvLevel(default_level=1536, kv_tokens=275_000)
    for b in (100, 2900) * 100:
        kv.asked(50, b)
    level = kv.level()
    for _ in range(MIN_SAMPLES * 2):
        kv.ended(50, 100, 100)
    assert kv.level() == level


def test_short_answers_leave_the_default_level():
    # The 20-round workload's shape: 100-token answers, where max_num_seqs is the limit.
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    _asked(kv, 5000, 150, 100)
    assert kv.level() == 1536


def test_an_unknown_cache_leaves_the_default_and_the_floor_bounds_it():
    unknown = KvLevel(default_level=384, kv_tokens=0)
    tiny = KvLevel(default_level=384, kv_tokens=1000)
    _asked(unknown, MIN_ASKED, 100, 8000)
    _asked(tiny, MIN_ASKED, 100, 8000)
    assert unknown.level() == 384
    assert tiny.level() == FLOOR


def test_the_estimate_follows_a_run_whose_budgets_change():
    kv = KvLevel(default_level=1536, kv_tokens=829_136)
    _asked(kv, 2000, 100, 100)
    assert kv.level() == 1536
    _asked(kv, 16000, 100, 3000)
    # 100 + 3000 / 2 tokens a request once the short budgets have decayed away.
    assert kv.level() == pytest.approx(829_136 * FILL / 1600, rel=0.02)


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


def test_the_sizing_is_off_unless_asked_for(monkeypatch):
    from worker.engine.kv_level import KV_ADMISSION_ENV, kv_admission_wanted

    monkeypatch.delenv(KV_ADMISSION_ENV, raising=False)
    assert not kv_admission_wanted()
    monkeypatch.setenv(KV_ADMISSION_ENV, "1")
    assert kv_admission_wanted()
    monkeypatch.setenv(KV_ADMISSION_ENV, "0")
    assert not kv_admission_wanted()


def test_fitting_level_bounds():
    from worker.engine.sizing import fitting_level

    assert fitting_level(0, 850, default_level=1536) == 1536  # cache unknown
    assert fitting_level(275_000, 1850, default_level=1536, fill=1.0) == 148
    assert fitting_level(275_000, 1850, default_level=100) == 100  # never above the default
    assert fitting_level(1000, 1850, default_level=1536) == FLOOR
    with pytest.raises(ValueError, match="at least 1"):
        fitting_level(1000, 10, default_level=0)


def test_a_hybrids_states_lower_the_level_to_what_its_blocks_hold():
    # Qwen3.6-27B on an H200 with prefix caching (tests/unit/test_cache_plan.py): 1,573 blocks of 784 tokens,
    # 6 of them a sequence's states. Without the states the cache looked like 1.23 M tokens for ~850-token
    # requests: 1,305 of them, where the blocks hold 1,573 / (2 + 6) = 196 (issue 56).
    slots, states = 1573 * 784, 6 * 784 + 784 / 2
    dense_view = KvLevel(default_level=1536, kv_tokens=slots)
    hybrid = KvLevel(default_level=1536, kv_tokens=slots, per_sequence_tokens=states)
    for kv in (dense_view, hybrid):
        _asked(kv, 500, 100, 1500)
    assert dense_view.level() == 1305
    assert hybrid.level() == int(slots * FILL / (850 + states)) == 186
    assert "of state" in hybrid.describe()
