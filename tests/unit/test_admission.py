"""The admission gate: never more than its level in the engine, oldest batch first, nothing leaked."""

from __future__ import annotations

import asyncio

import pytest

from worker.engine.admission import AdmissionGate, HandedBack, admission_level, batches_to_hold
from worker.engine.host import _supported, _unfinished_counter, engine_defaults, expected_max_num_seqs


def test_level_and_held_batches_follow_max_num_seqs():
    assert admission_level(256) == 384
    assert admission_level(1024) == 1536
    # ceil((6 x max_num_seqs + level) / batch) + 2: the tails' open batches and the level.
    assert batches_to_hold(256) == 32
    assert batches_to_hold(1024) == 122
    assert batches_to_hold(256, batch_size=256) == 10
    # More sequences never means fewer batches held.
    assert all(batches_to_hold(n) <= batches_to_hold(n + 64) for n in range(64, 2048, 64))


def test_gate_admits_lowest_order_first_and_never_above_its_level():
    async def scenario() -> tuple[list, int]:
        gate = AdmissionGate(3)
        granted: list[tuple] = []
        peak = 0

        async def conversation(order: tuple, seconds: float) -> None:
            nonlocal peak
            async with gate.slot(order):
                granted.append(order)
                peak = max(peak, gate.admitted)
                await asyncio.sleep(seconds)

        # Batch 1 is taken after batch 0 but its tasks are created first: order, not arrival, decides.
        tasks = [asyncio.ensure_future(conversation((1, i), 0.01)) for i in range(4)]
        tasks += [asyncio.ensure_future(conversation((0, i), 0.01)) for i in range(4)]
        await asyncio.gather(*tasks)
        assert gate.admitted == 0 and gate.waiting == 0
        return granted, peak

    granted, peak = asyncio.run(scenario())
    assert peak == 3
    # The first three went straight in (free slots); every later grant is the lowest waiting order.
    assert granted[:3] == [(1, 0), (1, 1), (1, 2)]
    assert granted[3:] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3)]


def test_cancelled_waiters_give_up_their_place_and_slots():
    async def scenario() -> None:
        gate = AdmissionGate(1)
        await gate.acquire((0,))
        waiter = asyncio.ensure_future(gate.acquire((1,)))
        later = asyncio.ensure_future(gate.acquire((2,)))
        await asyncio.sleep(0)
        assert gate.waiting == 2
        waiter.cancel()  # shutdown or fencing aborts a held batch still waiting at the gate
        await asyncio.gather(waiter, return_exceptions=True)
        gate.release()
        await asyncio.wait_for(later, 1)  # the cancelled waiter's place went to the next one
        assert gate.admitted == 1 and gate.waiting == 0
        # Granted and cancelled in the same step: the slot comes back.
        gated = asyncio.ensure_future(gate.acquire((3,)))
        await asyncio.sleep(0)
        gate.release()  # grants (3,) ...
        gated.cancel()  # ... which is cancelled before it runs
        await asyncio.gather(gated, return_exceptions=True)
        assert gate.admitted == 0
        await asyncio.wait_for(gate.acquire((4,)), 1)

    asyncio.run(scenario())


def test_gate_refuses_a_level_below_one():
    with pytest.raises(ValueError, match="at least 1"):
        AdmissionGate(0)


def test_engine_defaults_leave_gpu_limits_to_vllm_and_keep_the_cpu_needs():
    gpu, cpu = engine_defaults(on_cpu=False), engine_defaults(on_cpu=True)
    assert "max_num_seqs" not in gpu and "max_num_batched_tokens" not in gpu
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] >= 8192
    assert gpu["enable_prefix_caching"] and cpu["enable_prefix_caching"]
    # The admission watermark the H200 steady state chose (docs/results/h200-gpu-steady-2026-12-03.txt):
    # GPUs only; the CPU build's cache is sized in GiB of its own and never the limit in tests.
    assert gpu["watermark"] == 0.01 and "watermark" not in cpu


def test_expected_max_num_seqs_before_the_engine_exists():
    assert expected_max_num_seqs({"max_num_seqs": 96}, cuda_visible="0") == 96
    assert expected_max_num_seqs({}, cuda_visible="") == engine_defaults(on_cpu=True)["max_num_seqs"]


def test_unfinished_count_on_every_supported_vllm():
    class OutputProcessor:
        def get_num_unfinished_requests(self) -> int:
            return 7

    class AsyncLLM026:  # vLLM 0.26: the count lives on the output processor only
        output_processor = OutputProcessor()

    class AsyncLLM032(AsyncLLM026):
        def get_num_unfinished_requests(self) -> int:
            return 9

    assert _unfinished_counter(AsyncLLM026())() == 7
    assert _unfinished_counter(AsyncLLM032())() == 9


def test_supported_vllm_releases():
    assert _supported("0.26.0") and _supported("0.32.0+cpu") and _supported("0.33.0")
    assert not _supported("0.25.1") and not _supported("0.34.0") and not _supported("nightly")


def test_only_batches_with_no_conversation_admitted_are_withdrawn_newest_first():
    async def scenario() -> None:
        gate = AdmissionGate(2)
        results: dict[tuple, object] = {}

        async def conversation(order: tuple) -> None:
            try:
                async with gate.slot(order):
                    await asyncio.sleep(0.01)
                results[order] = "done"
            except HandedBack:
                results[order] = "handed back"

        # Level 2: batch 0's two conversations go in, batches 1, 2 and 3 wait with none started.
        tasks = [asyncio.ensure_future(conversation((b, i))) for b in range(4) for i in range(2)]
        await asyncio.sleep(0)
        assert gate.unstarted() == [3, 2, 1]
        assert gate.withdraw_unstarted(2) == [3, 2]
        assert gate.unstarted() == [1] and gate.waiting == 2
        # A conversation of a withdrawn batch that arrives late is refused too.
        with pytest.raises(HandedBack):
            await gate.acquire((3, 9))
        await asyncio.gather(*tasks)
        assert [results[(b, i)] for b in range(4) for i in range(2)] == ["done"] * 4 + ["handed back"] * 4
        assert gate.admitted == 0 and gate.waiting == 0
        # Batch 0 and 1 started: nothing of theirs can be withdrawn; forgetting clears what was kept.
        assert gate.withdraw_unstarted(5) == []
        for b in range(4):
            gate.forget(b)
        assert not gate._started and not gate._withdrawn

    asyncio.run(scenario())


def test_a_batch_with_one_conversation_admitted_is_never_withdrawn():
    async def scenario() -> None:
        gate = AdmissionGate(1)
        await gate.acquire((0, 0))                 # batch 0 has started
        rest = asyncio.ensure_future(gate.acquire((0, 1)))
        other = asyncio.ensure_future(gate.acquire((1, 0)))
        await asyncio.sleep(0)
        assert gate.withdraw_unstarted(2) == [1]
        gate.release()
        await rest                                  # batch 0's second conversation still gets its slot
        with pytest.raises(HandedBack):
            await other
        assert gate.admitted == 1

    asyncio.run(scenario())
