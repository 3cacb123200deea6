"""A CPU tier the user asks for keeps a preempted answer's generated blocks, not only its prompt."""

from __future__ import annotations

import pytest

from ledger.errors import ConfigError
from worker.engine.args import parse_engine_args
from worker.engine.kv_tier import keep_generated_blocks, tier_requested


def _prompt_only(args: dict) -> bool:
    """What vLLM's connector reads (vllm/v1/kv_offload/base.py): absent means prompt blocks only."""
    extra = (args.get("kv_transfer_config") or {}).get("kv_connector_extra_config") or {}
    return bool(extra.get("offload_prompt_only", True))


def test_a_tier_typed_as_a_user_would_keeps_generated_blocks():
    typed = parse_engine_args(["kv_offloading_size=40"])
    assert _prompt_only(typed)  # vLLM's default: a preempted thinking trace would be recomputed
    chosen = keep_generated_blocks(typed)
    assert not _prompt_only(chosen)
    assert chosen["kv_offloading_size"] == 40 and typed == {"kv_offloading_size": 40}  # the input is not changed


def test_the_users_own_choice_and_the_rest_of_their_config_are_kept():
    explicit = parse_engine_args(["kv_offloading_size=40",
                                  'kv_transfer_config={"kv_connector_extra_config":{"offload_prompt_only":true}}'])
    assert keep_generated_blocks(explicit) is explicit and _prompt_only(explicit)
    other = parse_engine_args(["kv_offloading_size=8", 'kv_transfer_config={"kv_connector_extra_config":'
                               '{"block_size":64},"kv_role":"kv_both"}'])
    chosen = keep_generated_blocks(other)
    assert chosen["kv_transfer_config"] == {"kv_connector_extra_config": {"block_size": 64,
                                                                          "offload_prompt_only": False},
                                            "kv_role": "kv_both"}
    assert other["kv_transfer_config"]["kv_connector_extra_config"] == {"block_size": 64}


@pytest.mark.parametrize("args", [{}, {"kv_offloading_size": None}, {"kv_offloading_size": 0},
                                  {"kv_offloading_size": 40, "kv_offloading_backend": "lmcache"},
                                  {"watermark": 0.01}])
def test_without_a_native_tier_nothing_is_added(args):
    assert not tier_requested(args)
    assert keep_generated_blocks(args) is args


def test_a_config_that_is_not_an_object_is_named():
    with pytest.raises(ConfigError, match="kv_transfer_config must be a JSON object"):
        keep_generated_blocks({"kv_offloading_size": 4, "kv_transfer_config": "offload"})
    with pytest.raises(ConfigError, match="kv_connector_extra_config must be a JSON object"):
        keep_generated_blocks({"kv_offloading_size": 4, "kv_transfer_config": {"kv_connector_extra_config": [1]}})


def test_vllms_own_config_class_reads_what_regen_writes():
    config = pytest.importorskip("vllm.config")
    chosen = keep_generated_blocks({"kv_offloading_size": 40})
    transfer = config.KVTransferConfig(**chosen["kv_transfer_config"])
    assert transfer.kv_connector_extra_config.get("offload_prompt_only", True) is False


def test_the_gpu_benchmark_prices_regens_tier_against_the_one_vllm_builds():
    from bench.gpu.throughput import phase_settings

    _, regens, bare = phase_settings(["kv_offloading_size=40"], [], on_cpu=False)
    assert not _prompt_only(regens) and regens["kv_offloading_size"] == 40
    assert _prompt_only(bare) and bare["kv_offloading_size"] == 40  # (a): the tier as a user's LLM(...) gets it
    _, regens, bare = phase_settings([], ["kv_offloading_size=40"], on_cpu=False)
    assert not _prompt_only(regens) and "kv_offloading_size" not in bare  # a candidate reaches regen's phases only


def test_a_tier_the_host_cannot_pin_is_refused_by_name():
    from worker.engine.kv_tier import HOST_SHARE, check_host_memory

    check_host_memory({"kv_offloading_size": 40}, available_bytes=64 * 2**30)  # 40 of 64 GiB: 62%, fits
    with pytest.raises(ConfigError, match=r"kv_offloading_size=40: .* pin 40 GiB where the host has 48 GiB"):
        check_host_memory({"kv_offloading_size": 40}, available_bytes=48 * 2**30)  # 83% > HOST_SHARE
    assert HOST_SHARE < 40 / 48
    check_host_memory({"watermark": 0.01}, available_bytes=0)  # no tier: nothing to check
    with pytest.raises(ConfigError, match="give each engine on this node a smaller tier"):
        check_host_memory({"kv_offloading_size": 2**20})  # this host's own memory, read: no host pins a PiB
