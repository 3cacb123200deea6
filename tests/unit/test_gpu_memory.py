"""The share of the card regen asks vLLM for: more than vLLM's only on big cards the engine has alone."""

from __future__ import annotations

import os
import stat

import pytest

from worker.engine.gpu_memory import BIG_GIB, EMPTY_MIB, SHARE_ALONE, gpu_cards, memory_share
from worker.engine.host import REGEN_GPU_CHOICES, engine_defaults

H200 = 143771.0  # MiB, as nvidia-smi reports an H200's memory.total


def test_an_empty_big_card_gets_the_larger_share():
    assert memory_share([(H200, 0.0)]) == {"gpu_memory_utilization": SHARE_ALONE}
    assert memory_share([(H200, EMPTY_MIB), (H200, 3.0)]) == {"gpu_memory_utilization": SHARE_ALONE}


def test_a_card_in_use_small_or_unknown_keeps_vllms_default():
    assert memory_share([(H200, EMPTY_MIB + 1)]) == {}            # another process holds memory on it
    assert memory_share([(H200, 0.0), (H200, 20_000.0)]) == {}    # one of the engine's cards is shared
    assert memory_share([(BIG_GIB * 1024 - 1, 0.0)]) == {}        # 5% of a small card is too little headroom
    assert memory_share(None) == {} and memory_share([]) == {}    # nvidia-smi missing or silent


def test_engine_defaults_take_the_share_on_gpus_and_never_on_the_cpu():
    assert engine_defaults(on_cpu=False, cards=[(H200, 0.0)])["gpu_memory_utilization"] == SHARE_ALONE
    assert "gpu_memory_utilization" not in engine_defaults(on_cpu=False, cards=[(H200, 9_000.0)])
    assert "gpu_memory_utilization" not in engine_defaults(on_cpu=True, cards=[(H200, 0.0)])
    # bench/gpu/throughput.py's bare phase leaves every one of regen's GPU choices to vLLM.
    chosen = engine_defaults(on_cpu=False, cards=[(H200, 0.0)])
    assert {"watermark", "gpu_memory_utilization"} <= set(REGEN_GPU_CHOICES) <= set(chosen)


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH that prints what a real one prints and records its arguments."""
    script = tmp_path / "nvidia-smi"
    script.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\nprintf "143771, 4\\n143771, 61234\\n"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "args"


def test_gpu_cards_reads_each_visible_card(nvidia_smi):
    assert gpu_cards(cuda_visible="2,3") == [(143771.0, 4.0), (143771.0, 61234.0)]
    assert "-i 2,3" in nvidia_smi.read_text()
    assert gpu_cards(cuda_visible="") is None  # no card visible: nothing to size


def test_gpu_cards_without_nvidia_smi_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_cards(cuda_visible="0") is None
