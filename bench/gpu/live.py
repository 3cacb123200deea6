"""One bare engine loaded in this process, and the scheduler settings changed on it live.

Shared by bench.gpu.sweep (a burst per setting) and bench.gpu.steady (one kept-fed engine, a
segment per setting): a 32B engine takes 130-280 s to load, so both compare settings on one
engine by changing what vLLM's scheduler reads at every step, on its live objects.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

#: Before vLLM is imported: the engine core in this process, so its scheduler can be reached.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def time_mean(samples: list[tuple[float, float]]) -> float:
    """Mean of (value, seconds the step took) samples, weighted by the step's time (a drain's many
    short steps must not pull a run's mean concurrency down)."""
    total = sum(dt for _, dt in samples)
    return sum(v * dt for v, dt in samples) / total if total > 0 else 0.0


@dataclass(frozen=True)
class Settings:
    label: str
    cap: int
    watermark: float
    batched: int
    #: False only for ``gmu``: the engine may use the blocks bench.gpu.steady holds back for --as-built.
    hold: bool = True
    #: False only for ``offload=off``: an engine built with a CPU tier for its KV cache (vLLM's
    #: ``kv_offloading_size``) recomputes a preempted request instead of loading it back from that tier.
    loads: bool = True


def parse_settings(spec: str, *, kv_tokens: int, footprint: float, default_cap: int,
                   default_batched: int) -> Settings:
    """``default`` | ``cap=N`` | ``fill=F`` | ``watermark=W`` | ``batched=N`` | ``gmu`` | ``offload=off``,
    comma-joined.

    ``fill=F``: the running cap regen's sizing picks for F of the cache (worker/engine/sizing.py).
    ``offload=off``: on an engine built with a CPU tier (``kv_offloading_size``), preempted requests are
    recomputed as without one, while the tier still stores: what loading back is worth, on one engine."""
    from worker.engine.sizing import fitting_level

    cap, watermark, batched, hold, loads = default_cap, 0.0, default_batched, True, True
    for part in filter(None, spec.split(",")):
        key, _, value = part.partition("=")
        if key == "default":
            continue
        if key == "cap":
            cap = int(value)
        elif key == "fill":
            cap = fitting_level(kv_tokens, footprint, default_level=default_cap, fill=float(value))
        elif key == "watermark":
            watermark = float(value)
        elif key == "batched":
            batched = int(value)
        elif key == "gmu":
            hold = False
        elif key == "offload" and value in ("on", "off"):
            loads = value == "on"
        else:
            raise SystemExit(f"--try {spec!r}: unknown setting {key!r} "
                             "(default, cap=N, fill=F, watermark=W, batched=N, gmu, offload=on|off)")
    return Settings(spec, cap, watermark, batched, hold, loads)


NO_TIER = ("offload=off: this engine has no KV connector; build it with --engine-arg kv_offloading_size=GIB "
           "(and offload_prompt_only false: docs/performance.md)")


def check_tries(scheduler: Any, every: list[Settings]) -> None:
    """Refuse settings this engine cannot run before the first of them, not minutes of device time in."""
    if any(not s.loads for s in every) and getattr(scheduler, "connector", None) is None:
        raise SystemExit(NO_TIER)


def set_tier_loads(scheduler: Any, on: bool) -> None:
    """Let the scheduler load preempted requests back from its KV connector's CPU tier, or not.

    vLLM asks the connector, for each request it admits, how many of its tokens it can load
    (``get_num_new_matched_tokens``). Off, the connector still does its bookkeeping (and keeps
    storing every block), but the answer is 0: the request is recomputed, as on an engine without
    the tier. A lookup the connector defers (``None``: transfers still in flight) stays deferred.
    """
    connector = getattr(scheduler, "connector", None)
    if connector is None:
        if on:
            return
        raise SystemExit(NO_TIER)
    original = getattr(connector, "_regen_matched", None)
    if original is None:
        original = connector._regen_matched = connector.get_num_new_matched_tokens
    if on:
        connector.get_num_new_matched_tokens = original
        return

    def recompute_instead(request, num_computed_tokens, *args, **kwargs):
        tokens, _ = original(request, num_computed_tokens, *args, **kwargs)
        return (None, False) if tokens is None else (0, False)

    connector.get_num_new_matched_tokens = recompute_instead


@dataclass
class LiveEngine:
    """Bare ``LLM`` over the benchmark's requests, with its scheduler and KV-cache manager at hand."""

    bare: Any
    prompts: list[dict]
    params: list
    loaded_s: float

    @classmethod
    def load(cls, model: str, rows: list[dict], *, max_tokens: int, ignore_eos: bool, engine_arg: list[str],
             cpu: bool) -> LiveEngine:
        from bench.throughput import BareEngine, engine_args, run_config
        from worker.engine.args import parse_engine_args

        extra = {"max_model_len": 8192, **({} if cpu else {"load_format": "dummy"}), **parse_engine_args(engine_arg)}
        config = run_config(model, max_tokens, ignore_eos=ignore_eos)
        t0 = time.perf_counter()
        bare = BareEngine(model, engine_args(extra, on_cpu=cpu))
        prompts, params = bare.requests(rows, config.as_record())
        return cls(bare, prompts, params, time.perf_counter() - t0)

    @property
    def engine(self):
        return self.bare.llm.llm_engine

    @property
    def scheduler(self):
        return self.engine.engine_core.engine_core.scheduler  # InprocClient -> EngineCore -> Scheduler

    @property
    def kv(self):
        return self.scheduler.kv_cache_manager

    @property
    def cache(self):
        return self.engine.vllm_config.cache_config

    @property
    def kv_tokens(self) -> int:
        return self.bare.kv_tokens

    def moments(self):
        from worker.engine.sizing import LengthMoments

        return LengthMoments.of((len(x["prompt_token_ids"]) for x in self.prompts),
                                (sp.max_tokens for sp in self.params))

    def apply(self, s: Settings) -> None:
        """Set what the scheduler reads at every step: its running cap, step token budget and watermark."""
        scheduler = self.scheduler
        scheduler.max_num_running_reqs = s.cap
        if hasattr(scheduler, "max_num_active_reqs"):  # 0.32: admission reads this one (0.26: the cap above)
            scheduler.max_num_active_reqs = s.cap
        scheduler.max_num_scheduled_tokens = s.batched
        self.kv.watermark_blocks = int(s.watermark * self.kv.block_pool.num_gpu_blocks)
        set_tier_loads(scheduler, s.loads)

    def engine_line(self) -> str:
        """What the engine was built with, for the benchmark's first line."""
        cfg = self.engine.vllm_config
        return (f"KV cache {self.kv_tokens:,} tokens ({self.cache.num_gpu_blocks:,} blocks of {self.cache.block_size}) "
                f"at gpu_memory_utilization {self.cache.gpu_memory_utilization}; max_num_seqs "
                f"{self.scheduler.max_num_running_reqs}; batched tokens {self.scheduler.max_num_scheduled_tokens}; "
                f"async scheduling {cfg.scheduler_config.async_scheduling}; cudagraph sizes up to "
                f"{max(getattr(cfg.compilation_config, 'cudagraph_capture_sizes', None) or [0])}"
                f"{tier_line(cfg)}")


def tier_line(cfg: Any) -> str:
    """The KV cache's CPU tier, where the engine has one (vLLM's ``kv_offloading_size``)."""
    kt = getattr(cfg, "kv_transfer_config", None)
    if kt is None or not getattr(kt, "kv_connector", None):
        return "; no CPU tier for the KV cache"
    extra = kt.kv_connector_extra_config or {}
    size = extra.get("cpu_bytes_to_use")
    return (f"; KV cache's CPU tier: {kt.kv_connector}, "
            f"{f'{float(size) / 2**30:.0f} GiB' if size else 'size not given'}, offload_prompt_only "
            f"{extra.get('offload_prompt_only', 'not set (vLLM 0.26: True, only prompts kept)')}")
