"""The share of the card regen asks vLLM for: more than vLLM's only on big cards the engine has alone."""

from __future__ import annotations

import os
import stat

import pytest

from worker.engine.gpu_memory import BIG_GIB, EMPTY_MIB, SHARE_ALONE, Card, gpu_cards, memory_share
from worker.engine.host import REGEN_GPU_CHOICES, engine_defaults, expected_max_num_seqs

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


def _stand_in(tmp_path, monkeypatch, lines: str):
    """A stand-in nvidia-smi on PATH that prints ``lines`` as a real one does and records its arguments."""
    script = tmp_path / "nvidia-smi"
    script.write_text(f'#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\nprintf "{lines}"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "args"


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    return _stand_in(tmp_path, monkeypatch, "143771, 4, NVIDIA H200\\n143771, 61234, NVIDIA H200\\n")


def test_gpu_cards_reads_each_visible_card(nvidia_smi):
    assert gpu_cards(cuda_visible="2,3") == [Card(143771.0, 4.0, "NVIDIA H200"), Card(143771.0, 61234.0, "NVIDIA H200")]
    assert "-i 2,3" in nvidia_smi.read_text()
    assert gpu_cards(cuda_visible="") is None  # no card visible: nothing to size


def test_gpu_cards_without_nvidia_smi_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_cards(cuda_visible="0") is None
    assert expected_max_num_seqs({}, cuda_visible="0") == 256  # vLLM's smaller default: held batches err low


@pytest.mark.parametrize(("line", "seqs"), [
    ("143771, 4, NVIDIA H200", 1024),                 # vLLM's offline default on big cards
    ("81920, 4, NVIDIA A100-SXM4-80GB", 256),         # ... except the A100
    ("49140, 4, NVIDIA L40S", 256),                   # a small card
    ("183359, 4, NVIDIA B200", 1024),
])
def test_expected_max_num_seqs_reads_the_first_visible_card(tmp_path, monkeypatch, line, seqs):
    args = _stand_in(tmp_path, monkeypatch, line + "\\n")
    assert expected_max_num_seqs({}, cuda_visible="5,6") == seqs
    assert "-i 5 " in args.read_text() + " "  # only the first card: vLLM sizes by the card it runs on
