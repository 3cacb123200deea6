"""pytest plugin: one in-process vLLM engine (the trained tiny model), shared by every test of the session.

The trained model thinks, calls the offered tools and stops, so the fidelity tests
see complete multi-turn conversations, parsed tool calls and spliced results, not
only answers cut at max_tokens. Loading takes ~20 s, so engine tests share this one. Tests that need a worker
*process* (signals, restarts) use tests/worker_fixtures.py instead.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def engine_host(trained_model):
    from tests.worker_fixtures import TEST_ENGINE_ENV

    for key, value in TEST_ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    from worker.engine import EngineHost

    host = EngineHost(model=str(trained_model), engine_args={"max_model_len": 4096})
    host.start()
    yield host
    host.shutdown()


@pytest.fixture(scope="session")
def renderer(engine_host):
    from worker.rendering import Renderer

    return Renderer(engine_host.tokenizer, engine_host.max_model_len)
