"""The KV cache's CPU tier: when a user asks for one, make it keep what a regen run loses.

vLLM (0.26 and 0.32, read in their source) builds a host-memory tier for the KV cache from ``kv_offloading_size=GIB``
(its native OffloadingConnector): every full KV block is copied to pinned host memory, and a
request that comes back to the engine loads what the tier holds of it instead of recomputing it.
In a regen run the blocks worth keeping are the *generated* ones: where the cache is the limit (long
thinking traces: the seed's regime), requests are preempted mid-answer, lose their blocks, and come
back as a prefill of prompt + everything generated so far (docs/performance.md, "Preemption without
recomputation").

But vLLM's connector keeps **prompt blocks only** unless told otherwise (``offload_prompt_only``,
default True: vllm/v1/kv_offload/base.py, aimed at serving, where a multi-turn chat reuses prompts
and drops the reasoning). So a user who types ``--engine-arg kv_offloading_size=40`` gets a tier that
holds nothing of a preempted thinking trace but its ~100-token prompt. regen sets
``offload_prompt_only`` to False in that case, unless the user set it: copying every generated block
once costs the PCIe link ~1 GB/s at 4K tokens a second of the 32B shape (256 KiB a token), against
tens of GB/s it carries.

regen does not turn the tier on by itself. Measured on an H200 (2026-12-06, the 32B shape, a 40 GiB tier
beside a 75 GB GPU cache): loading from it gained nothing over recomputing. The tier stores every block
as it is computed and evicts the oldest, and a returning request loads only a prefix of its blocks, so
a tier smaller than the GPU cache plus the preempted backlog has lost the prefix by the time the request
comes back (docs/performance.md, "Preemption without recomputation"). It stays the user's engine argument,
worth trying only where the host can pin more than the GPU's cache.
"""

from __future__ import annotations

import copy
from typing import Any

from ledger.errors import ConfigError

#: vLLM's native backend: the one whose connector reads ``offload_prompt_only`` (LMCache's does not).
NATIVE = "native"

#: The most of the host's available memory one engine's tier may pin. Pinned pages cannot be swapped:
#: a node whose engines pin more than it has is one the kernel's OOM killer picks processes from (a
#: worker, Postgres' client, sshd) rather than one that refuses to start.
HOST_SHARE = 0.8


def tier_requested(args: dict[str, Any]) -> bool:
    """Whether these engine args build vLLM's native CPU tier."""
    size = args.get("kv_offloading_size")
    return size is not None and float(size) > 0 and args.get("kv_offloading_backend", NATIVE) == NATIVE


def keep_generated_blocks(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with the tier told to keep generated blocks too, where a native tier is asked for.

    Only ``kv_transfer_config.kv_connector_extra_config.offload_prompt_only`` is added, and only when
    absent: the user's explicit value wins, and everything else in their config is kept (vLLM merges
    ``cpu_bytes_to_use`` into the same extra config). Returns ``args`` itself when nothing changes.

    Raises:
        ConfigError: ``kv_transfer_config`` or its extra config is given but is not a JSON object.
    """
    if not tier_requested(args):
        return args
    transfer = args.get("kv_transfer_config")
    if transfer is None:
        transfer = {}
    if not isinstance(transfer, dict):
        raise ConfigError(f"kv_transfer_config must be a JSON object, got {transfer!r}")
    extra = transfer.get("kv_connector_extra_config")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise ConfigError(f"kv_transfer_config.kv_connector_extra_config must be a JSON object, got {extra!r}")
    if "offload_prompt_only" in extra:
        return args
    transfer = copy.deepcopy(transfer)
    transfer["kv_connector_extra_config"] = {**extra, "offload_prompt_only": False}
    return {**args, "kv_transfer_config": transfer}


def check_host_memory(args: dict[str, Any], available_bytes: int | None = None) -> None:
    """Refuse a tier larger than the host can pin, before the engine pins it.

    The node's engines start one after another, each pinning its tier, so the engine that would
    overcommit the host is the one refused, by name, instead of the OOM killer choosing a victim.

    Raises:
        ConfigError: the tier is more than ``HOST_SHARE`` of the host's available memory.
    """
    if not tier_requested(args):
        return
    size_gib = float(args["kv_offloading_size"])
    size = f"{size_gib:,.0f}" if size_gib >= 10 else f"{size_gib:g}"
    if available_bytes is None:
        import psutil  # vLLM's own dependency: present wherever an engine is built, not in the control plane

        available_bytes = psutil.virtual_memory().available
    if size_gib * 2**30 > HOST_SHARE * available_bytes:
        raise ConfigError(
            f"kv_offloading_size={args['kv_offloading_size']}: this engine's CPU tier would pin {size} GiB "
            f"where the host has {available_bytes / 2**30:.0f} GiB available (at most {HOST_SHARE:.0%} of it may be "
            "pinned); give each engine on this node a smaller tier")
