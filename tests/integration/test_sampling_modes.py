"""A ``--thinking mix`` run with two sampling profiles: each row records its mode's, and vLLM samples with it.

The run is built as ``regen submit`` builds it (producer/run_config.py) for the trained tiny model, with a profile
per mode; the worker's own path (generate_batch) runs it on the session's engine, whose ``generate`` is watched:
the SamplingParams each request reaches vLLM with are read there, penalties included.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine

PROMPTS = ["What is 2+2?", "Name a colour.", "Say hello.", "What is the capital of France?", "Count to three.",
           "Is water wet?", "Spell cat.", "What day follows Monday?"]


def test_each_row_records_its_modes_sampling_and_vllm_gets_its_penalties(engine_host, renderer, trained_model):
    from producer.run_config import build_run_config
    from worker.conversation.generation import generate_batch

    config = build_run_config(str(trained_model), max_tokens=16, thinking="mix", seed=5,
                              sampling_thinking='{"presence_penalty": 0.5, "temperature": 0.9}',
                              sampling_no_thinking='{"presence_penalty": 1.25, "frequency_penalty": 0.3, '
                                                   '"temperature": 0.4}')
    run = {"id": 1, "name": "modes", "model": engine_host.model, "config_hash": config.hash,
           "provenance": config.provenance(), "sampling": config.as_record()}
    samples = [{"sample_id": f"m{n}", "messages": [{"role": "user", "content": text}], "tools": None}
               for n, text in enumerate(PROMPTS)]

    seen: dict[str, object] = {}
    llm = engine_host._llm
    original = llm.generate

    def watched(prompt, params, request_id, *args, **kwargs):
        seen[tuple(prompt["prompt_token_ids"])] = params
        return original(prompt, params, request_id, *args, **kwargs)

    llm.generate = watched
    try:
        rows = engine_host.submit(generate_batch(engine_host, renderer, samples, run)).result(timeout=600)
    finally:
        del llm.generate

    assert {row["thinking"] for row in rows} == {True, False}, "a mix of both modes"
    for row in rows:
        want = (0.9, 0.5, 0.0) if row["thinking"] else (0.4, 1.25, 0.3)
        recorded = row["sampling"]
        assert (recorded["temperature"], recorded["presence_penalty"], recorded.get("frequency_penalty", 0.0)) == want
        assert "sampling_no_thinking" not in recorded
        for event in row["events"]:
            params = seen[tuple(event["prompt_token_ids"])]
            assert (params.temperature, params.presence_penalty, params.frequency_penalty) == want, row["sample_id"]
