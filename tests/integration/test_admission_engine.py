"""Admission on the real engine: the gate bounds what vLLM holds, oldest batch first, and the
engine reports its limits the same way on every supported vLLM."""

from __future__ import annotations

import asyncio

import pytest

from producer.dataset.normalize import normalize_row
from worker.engine.admission import AdmissionGate, admission_level

pytestmark = pytest.mark.engine


def _samples(n: int, tag: str) -> list[dict]:
    return [normalize_row({"messages": [{"role": "user", "content": f"{tag}: count to {i + 3}, please."}]})
            for i in range(n)]


def _run(engine_host, renderer, max_tokens: int = 24) -> dict:
    return {"id": 1, "name": "admission", "model": engine_host.model, "config_hash": "x" * 64,
            "provenance": {"engine": engine_host.engine_version, "chat_template_sha256": renderer.template_hash},
            "sampling": {"temperature": 0.8, "top_p": 0.95, "top_k": 20, "max_tokens": max_tokens, "seed": 3,
                         "thinking": "off"}}


class RecordingGate(AdmissionGate):
    """The real gate, recording each grant's order and what the engine held at that moment."""

    def __init__(self, level: int, engine_host):
        super().__init__(level)
        self.engine_host = engine_host
        self.grants: list[tuple] = []
        self.engine_peak = 0

    async def acquire(self, order: tuple) -> None:
        await super().acquire(order)
        self.grants.append(order)
        self.engine_peak = max(self.engine_peak, self.engine_host.num_unfinished())


def test_engine_limits_as_built(engine_host):
    # The CPU build keeps regen's CPU settings; the gate sits above max_num_seqs.
    assert engine_host.max_num_seqs == 256
    assert engine_host.admission.level == admission_level(256)
    assert engine_host.num_unfinished() == 0
    assert engine_host.num_unfinished() == engine_host._llm.output_processor.get_num_unfinished_requests()


def test_the_gate_bounds_the_engine_and_admits_the_oldest_batch_first(engine_host, renderer):
    from worker.conversation.generation import generate_batch

    run = _run(engine_host, renderer)
    gate = RecordingGate(3, engine_host)
    short_before = engine_host.occupancy.total.short_waiting
    saved, engine_host.admission = engine_host.admission, None

    async def two_batches():
        engine_host.admission = gate  # swapped on the engine loop, where it is read
        first = asyncio.ensure_future(generate_batch(engine_host, renderer, _samples(6, "first"), run))
        second = asyncio.ensure_future(generate_batch(engine_host, renderer, _samples(6, "second"), run))
        return await asyncio.gather(first, second)

    try:
        first, second = engine_host.submit(two_batches()).result(timeout=900)
    finally:
        engine_host.admission = saved
    assert [r["status"] for r in first + second] == ["done"] * 12
    assert gate.engine_peak <= 3, f"the engine held {gate.engine_peak} requests with a gate of 3"
    assert gate.admitted == 0 and gate.waiting == 0
    tickets = [order[0] for order in gate.grants]
    # Every conversation of the batch taken first was admitted before any of the second's.
    assert tickets == sorted(tickets) and len(set(tickets)) == 2
    # The occupancy sampler (worker/engine/occupancy.py) saw what this gate did: an engine far below
    # max_num_seqs while conversations waited at the gate, the starvation it exists to report.
    assert engine_host.occupancy.total.short_waiting > short_before


async def _until_started(engine_host, n: int, timeout_s: float = 300.0) -> None:
    """On the engine loop: wait until ``n`` of vLLM's requests have produced a token (no longer prefilling)."""
    states = engine_host._llm.output_processor.request_states
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while sum(not s.is_prefilling for s in states.values()) < n:
        assert loop.time() < deadline, f"the engine never started {n} requests"
        await asyncio.sleep(0.005)


def test_abort_unstarted_drops_only_the_requests_still_waiting_for_their_first_step(engine_host):
    # The estimate's probe ends its drain this way (worker/engine/pilot.py): what vLLM has not yet
    # started is dropped, what runs is kept. 16 more requests than max_num_seqs: the first 256 run
    # (one step admits them all: short prompts, no chunking on the CPU build), the last 16 wait.
    extra, max_tokens = 16, 48
    sampling = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
    prompts = [[11 + i % 50, 12, 13, 14, 15 + i % 7] for i in range(engine_host.max_num_seqs + extra)]

    async def scenario():
        tasks = [asyncio.ensure_future(engine_host.generate(p, sampling)) for p in prompts]
        await _until_started(engine_host, engine_host.max_num_seqs)
        aborted = await engine_host.abort_unstarted()
        return aborted, await asyncio.gather(*tasks)

    aborted, generations = engine_host.submit(scenario()).result(timeout=900)
    assert aborted == extra
    ended = [g.finish_reason for g in generations]
    # FCFS: the requests still waiting were the last ones submitted; nothing that ran was touched.
    assert ended == ["length"] * engine_host.max_num_seqs + ["abort"] * extra
    assert all(len(g.token_ids) == max_tokens for g in generations[:-extra])
    assert all(len(g.token_ids) == 0 for g in generations[-extra:])
    assert engine_host.num_unfinished() == 0
    # With nothing waiting, nothing is aborted.
    assert engine_host.submit(engine_host.abort_unstarted()).result(timeout=60) == 0


def test_abort_unstarted_withdraws_the_batches_waiting_at_the_gate_and_keeps_the_admitted(engine_host, renderer):
    # The probe's conversations beyond the gate's level wait there (each its own batch); they are
    # dropped too, and a slot freed later lets none of them in.
    from worker.conversation.generation import generate_batch
    from worker.engine.admission import HandedBack

    run = _run(engine_host, renderer, max_tokens=48)
    run["sampling"]["ignore_eos"] = True
    gate = RecordingGate(4, engine_host)
    saved, engine_host.admission = engine_host.admission, None

    async def scenario():
        engine_host.admission = gate
        batches = [asyncio.ensure_future(generate_batch(engine_host, renderer, _samples(1, f"b{i}"), run))
                   for i in range(10)]
        await _until_started(engine_host, 4)
        dropped = await engine_host.abort_unstarted()
        return dropped, await asyncio.gather(*batches, return_exceptions=True)

    try:
        dropped, outcomes = engine_host.submit(scenario()).result(timeout=900)
    finally:
        engine_host.admission = saved
    assert dropped == 6
    # The gate admits the oldest first: the first four ran to their budget, the six behind them were handed back.
    assert [type(o).__name__ for o in outcomes] == ["list"] * 4 + ["HandedBack"] * 6
    assert all(isinstance(o, HandedBack) for o in outcomes[4:])
    assert [(rows[0]["status"], rows[0]["usage"]["completion_tokens"]) for rows in outcomes[:4]] == [("done", 48)] * 4
    assert len(gate.grants) == 4 and gate.waiting == 0


def test_the_probes_drain_drops_what_waits_and_keeps_every_sample(engine_host, renderer):
    # worker/engine/pilot.py end to end on the real engine: 450 conversations kept in it, above the gate's
    # level (384) and max_num_seqs (256), so when its drain begins some wait at the gate and some in vLLM's
    # queue. Those are dropped; every sample's own record is kept, and nothing is left behind.
    from worker.engine.pilot import probe_samples

    samples = _samples(12, "probe")
    result = engine_host.submit(probe_samples(engine_host, renderer, samples, _run(engine_host, renderer),
                                              in_flight=450)).result(timeout=900)
    assert result["repeats"] > 0
    dropped = result["drain_unstarted_aborted"]
    # What ran was kept: vLLM runs up to 256 of them, fewer for a moment after a step ends some.
    assert 0 < dropped <= 450 - engine_host.max_num_seqs // 2, dropped
    assert [r["status"] for r in result["samples"]] == ["done"] * 12
    assert engine_host.num_unfinished() == 0 and engine_host.admission.waiting == 0


def test_the_probes_settled_phase_runs_its_share_of_the_samples_phase(engine_host, renderer):
    # --probe-settled 0.25: the rate is measured over a quarter of the samples' time, not as long again
    # (bench/probe_mix.py: the mix is a long run's by then, the window only noisier).
    from worker.engine.pilot import POLL_S, probe_samples

    samples = _samples(8, "settled")
    result = engine_host.submit(probe_samples(engine_host, renderer, samples, _run(engine_host, renderer, 32),
                                              in_flight=32, settled_share=0.25)).result(timeout=900)
    assert result["settled_share"] == 0.25 and result["repeats"] > 0
    samples_s, settled_s = result["samples_phase_s"], result["settled_phase_s"]
    # It ends at the first poll (every POLL_S) past a quarter of the samples' phase; a busy CI core may be late.
    assert 0.25 * samples_s <= settled_s <= 0.25 * samples_s + 5 * POLL_S, (samples_s, settled_s)
    assert [r["status"] for r in result["samples"]] == ["done"] * 8
