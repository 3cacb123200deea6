"""Loops stopped while they are generated: the worker's path, and vLLM's own abort of a watched request.

The first tests run generate_sample (worker/conversation/generation.py) on an engine that streams a scripted
looping completion to the watch it is given, as EngineHost does; the last runs the real engine (the session's
tiny model on vLLM's CPU build) with a watch that calls any repeat a loop, and checks that vLLM stopped the
request there: fewer ids than its budget, and nothing left running in the engine.
"""

from __future__ import annotations

import asyncio

import pytest

from ledger.quality import Thresholds, classify_sample
from tests.fixtures.model import VLLM_HINT
from tests.support.helpers import require
from worker.conversation.dialogue import Generation
from worker.engine.loop_watch import LOOP_FINISH, LoopWatch

require("vllm", VLLM_HINT, module_level=True)

T = Thresholds()


class WatchingEngine:
    """Streams a scripted completion to the watch it is given in chunks of 64 ids, as EngineHost does, stopping
    where the watch says the completion loops."""

    watches_loops = True

    def __init__(self, completion: list[int]):
        self.completion = completion
        self.watched: list[bool] = []

    async def generate(self, prompt_ids, params, *, loop_watch=None):
        self.watched.append(loop_watch is not None)
        ids = self.completion[:params["max_tokens"]]
        if loop_watch is not None:
            for at in range(0, len(ids), 64):
                if loop_watch.feed(ids[at:at + 64]):
                    return Generation(prompt_token_ids=list(prompt_ids), token_ids=ids[:at + 64],
                                      finish_reason=LOOP_FINISH)
        return Generation(prompt_token_ids=list(prompt_ids), token_ids=ids, finish_reason="length")


@pytest.fixture(scope="module")
def renderer(tiny_model):
    from transformers import AutoTokenizer

    from worker.conversation.rendering import Renderer

    return Renderer(AutoTokenizer.from_pretrained(tiny_model), 8192)


def _row(renderer, engine, **run_keys) -> dict:
    from worker.conversation.generation import generate_sample

    sampling = {"max_tokens": 4000, "seed": 1, "thinking": "off", "thinking_arg": "enable_thinking",
                "reasoning_parser": "qwen3", "tool_parser": "hermes", **run_keys}
    run = {"model": "m", "provenance": {}, "sampling": sampling, "quality_thresholds": None}
    sample = {"sample_id": "s", "messages": [{"role": "user", "content": "go"}]}
    return asyncio.run(generate_sample(engine, renderer, sample, run))


def _looping_words(renderer) -> list[int]:
    """A completion of ordinary vocabulary ids that starts to loop after ~300 ids."""
    ids = renderer.tokenizer.encode(" ".join(f"word{n}" for n in range(400)), add_special_tokens=False)
    return (ids[:300] + ids[300:340] * 100)[:4000]


def test_a_looping_generation_is_stopped_and_its_row_is_a_repetition_loop_of_its_length_at_the_stop(renderer):
    engine = WatchingEngine(_looping_words(renderer))
    row = _row(renderer, engine)
    assert engine.watched == [True]
    stopped = len(row["events"][0]["completion_token_ids"])
    assert stopped < 1000 and row["finish_reason"] == "repetition_loop"
    assert row["stop_reason"] == f"repetition_loop: stopped at {stopped} tokens"
    assert classify_sample(row, T)[0] == "repetition_loop"


def test_stop_loops_off_lets_the_generation_run_to_its_budget(renderer):
    engine = WatchingEngine(_looping_words(renderer))
    row = _row(renderer, engine, stop_loops="off")
    assert engine.watched == [False]
    assert len(row["events"][0]["completion_token_ids"]) == 4000 and row["stop_reason"] == "truncated"
    assert classify_sample(row, T)[0] == "repetition_loop"   # found after the fact, the budget spent


@pytest.mark.engine
def test_vllm_aborts_a_watched_request_where_the_watch_says_it_loops(engine_host):
    from worker.conversation.generation import engine_sampling

    prompt = engine_host.tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a story."}],
                                                       add_generation_prompt=True, tokenize=True, return_dict=False)
    params = engine_sampling({"temperature": 1.0, "ignore_eos": True}, seed=3, max_tokens=2048)
    # Any repeated pair of ids after 16 is a "loop" here: certain within 2,048 ids of a small vocabulary.
    watch = LoopWatch(ngram=2, min_tokens=16, max_share=0.0)
    generation = engine_host.submit(engine_host.generate(list(prompt), params, loop_watch=watch)).result(timeout=300)
    assert generation.finish_reason == LOOP_FINISH
    assert 16 <= len(generation.token_ids) < 2048 and len(generation.token_ids) == watch.length
    unfinished = engine_host.submit(_settled(engine_host)).result(timeout=60)
    assert unfinished == 0, "the aborted request still runs in the engine"


async def _settled(engine_host) -> int:
    for _ in range(50):
        if engine_host._count_unfinished() == 0:
            return 0
        await asyncio.sleep(0.1)
    return engine_host._count_unfinished()
