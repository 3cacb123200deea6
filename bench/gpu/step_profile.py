"""Where a decode step's time goes: a kernel profile of N engine steps, summed by kind.

Issue 31: on the 32B long workload one H200 runs ~182 sequences at ~52 ms a step, where reading
the weights and the live KV cache once takes ~25 ms at 4.8 TB/s (docs/performance.md, "The
watermark in a whole burst"). Scheduler settings no longer move it, so the next question is which
kernels the other half goes to: decode attention over 16-token pages, the GEMMs at M≈182, the
sampler, the norms and activations, or the GPU waiting on the host between kernels. This is asked
of a live in-process engine (bench.gpu.sweep loads one with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
so the model runs in this process and torch's profiler sees its kernels; whether it sees those inside
CUDA-graph replays is not measured yet, and the summary warns when the kernels cover little of the
wall) during a run, once the cache is full.

``StepProfiler`` wraps ``engine.step``: from ``at_s`` seconds into the run it records ``steps``
steps with ``torch.profiler`` and then summarises them. ``summarize`` is pure (kernel names and
microseconds in, a table out), so the categories are tested without a GPU.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.gpu.bound import StepFloor

#: Kernel kinds, first match wins (names are matched lower-cased). Attention first: FlashAttention's kernels'
#: names hold GEMM-like words on some builds, and the sampler's softmax is not attention's.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attn|attention|paged|reshape_and_cache|unified_attention|"
                             r"(^|[^a-z])mla([^a-z]|$)")),
    # Sorts, cumulative sums and softmaxes of a decode step are the sampler's top-p (attention's softmax is
    # inside its own kernels).
    ("sampler", re.compile(r"topk|top_k|topp|top_p|sampl|temperature|argmax|multinomial|gumbel|penalt|"
                           r"logits|exponential|sort|cumsum|softmax")),
    ("gemm", re.compile(r"gemm|cutlass|xmma|cublas|nvjet|matmul|\bmm\b|_mm\b|onednn|aten::addmm|aten::linear|packed_linear|"
                        r"wgmma|sm90_|splitk")),
    ("communication", re.compile(r"nccl|all_reduce|allreduce|all_gather")),
    # Before "memory": inductor fuses the norms and activations with their casts (triton_red_fused__to_copy_...).
    ("norm, rotary, activation", re.compile(r"norm|rsqrt|rotary|rope|silu|gelu|act_and_mul|swiglu|elementwise|"
                                            r"vectorized|reduce|triton_")),
    ("memory", re.compile(r"memcpy|memset|copy_|cat_|index_|gather|scatter|fill_")),
)


#: Below this share of the wall in kernels, the summary says the profile may be missing graph replays.
LOW_COVERAGE = 0.3


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, pattern in KINDS:
        if pattern.search(low):
            return kind
    return "other"


@dataclass
class StepProfile:
    steps: int
    wall_s: float
    #: kernel name -> (microseconds summed over the window, calls)
    kernels: dict[str, tuple[float, int]] = field(default_factory=dict)
    running_mean: float = 0.0
    on_device: bool = True
    #: KV-cache tokens the running requests held, on average over the window (0: not sampled)
    live_tokens_mean: float = 0.0

    @property
    def busy_us(self) -> float:
        return sum(us for us, _ in self.kernels.values())


def summarize(profile: StepProfile, *, top: int = 12, floor: StepFloor | None = None) -> str:
    """The window's time by kernel kind, per step and as a share of the wall, and its top kernels.

    With ``floor`` (bench/gpu/bound.py's roofline at the window's mean running count and live tokens),
    a line says what share of its floor the GEMMs, the attention and the whole step ran at: what is
    left inside each kind of kernel, so two profiles (a KV block size against another) compare by
    efficiency and not only by milliseconds.

    What the kernels do not cover of the wall is the device waiting (on the host, on a
    synchronisation): kernels on one stream do not overlap, so their sum is the busy time. On
    the CPU build the "kernels" are torch's operators on the host, and the shares are of those.
    """
    if profile.steps <= 0 or profile.wall_s <= 0:
        return "step profile: no steps recorded"
    wall_us = profile.wall_s * 1e6
    per_step_ms = profile.wall_s * 1e3 / profile.steps
    by_kind: dict[str, float] = {}
    for name, (us, _) in profile.kernels.items():
        kind = kind_of(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + us
    where = "GPU kernels" if profile.on_device else "CPU operators (vLLM's CPU build: no device kernels)"
    lines = [f"step profile: {profile.steps} steps in {profile.wall_s:.2f} s = {per_step_ms:.1f} ms a step, "
             f"{profile.running_mean:.0f} running on average; {where}, summed over the window:",
             "| kind | ms a step | share of the wall |", "|---|---:|---:|"]
    for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {us / 1e3 / profile.steps:.2f} | {us / wall_us:.0%} |")
    idle = max(0.0, wall_us - profile.busy_us)
    if profile.on_device:
        lines.append(f"| (device idle: no kernel running) | {idle / 1e3 / profile.steps:.2f} | {idle / wall_us:.0%} |")
    if profile.on_device and profile.busy_us < LOW_COVERAGE * wall_us:
        # Not measured yet on the H200: whether this torch's CUPTI reports kernels inside CUDA-graph replays.
        lines.append(f"NOTE: kernels cover only {profile.busy_us / wall_us:.0%} of the wall: if the graph-captured "
                     "decode's kernels are missing from the profile, the idle row is mostly their time; "
                     "--engine-arg enforce_eager=true names them (at eager speed)")
    if floor is not None and profile.on_device:
        gemm_ms, attention_ms = (by_kind.get(k, 0.0) / 1e3 / profile.steps for k in ("gemm", "attention"))
        lines.append(
            f"roofline at {profile.running_mean:.0f} running and {profile.live_tokens_mean:,.0f} live tokens: "
            f"{floor.seconds * 1e3:.1f} ms a step (GEMMs {floor.gemm_s * 1e3:.1f} ms, bound by "
            f"{'FLOPs' if floor.gemm_compute_bound else 'bytes'}; attention {floor.attention_s * 1e3:.1f} ms); "
            f"the step ran at {floor.seconds * 1e3 / per_step_ms:.0%} of it, the GEMMs at "
            f"{_share(floor.gemm_s * 1e3, gemm_ms)} of theirs, the attention at "
            f"{_share(floor.attention_s * 1e3, attention_ms)} of its")
    lines.append(f"top {top} kernels by time:")
    ranked = sorted(profile.kernels.items(), key=lambda kv: -kv[1][0])[:top]
    for name, (us, calls) in ranked:
        lines.append(f"  {us / wall_us:6.1%}  {calls / profile.steps:6.1f}/step  [{kind_of(name)}] {name[:120]}")
    return "\n".join(lines)


def _share(floor_ms: float, measured_ms: float) -> str:
    return f"{floor_ms / measured_ms:.0%}" if measured_ms > 0 else "-"


def kernel_times(events: Iterable, *, on_device: bool) -> dict[str, tuple[float, int]]:
    """(microseconds, calls) by name from ``profiler.key_averages()``: device time of kernels, or on the
    CPU build the operators' own (self) CPU time."""
    events = list(events)

    def add(out: dict[str, tuple[float, int]], e, us: float) -> None:
        prev = out.get(e.key, (0.0, 0))
        out[e.key] = (prev[0] + us, prev[1] + int(getattr(e, "count", 1) or 1))

    out: dict[str, tuple[float, int]] = {}
    if not on_device:
        for e in events:
            if (us := float(getattr(e, "self_cpu_time_total", 0) or 0)) > 0:
                add(out, e, us)
        return out
    # Kernels and copies only: an operator's row (aten::mm) would count its kernel's time twice. A torch whose
    # rows carry no device type falls back to every row with device time (the summary then says it is all).
    any_device_time = {}
    for e in events:
        us = float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0)
        if us <= 0:
            continue
        add(any_device_time, e, us)
        if str(getattr(e, "device_type", "")).upper().endswith("CUDA"):
            add(out, e, us)
    return out or any_device_time


class StepProfiler:
    """Wraps a step function: records ``steps`` steps from ``at_s`` seconds after ``arm()``, once."""

    def __init__(self, *, steps: int, at_s: float, running: Callable[[], int], on_device: bool,
                 live_tokens: Callable[[], float] = lambda: 0.0):
        if steps < 1:
            raise ValueError(f"--profile-steps must be at least 1, got {steps}")
        self.steps, self.at_s, self._running, self.on_device = steps, at_s, running, on_device
        self._live_tokens = live_tokens
        self._live_sum = 0.0
        self._t0 = 0.0
        self._prof = None
        self._seen = 0
        self._running_sum = 0
        self._start = 0.0
        self.result: StepProfile | None = None

    def arm(self) -> None:
        self._t0 = time.perf_counter()

    def wrap(self, step: Callable[[], object]) -> Callable[[], object]:
        def profiled_step():
            if self.result is None and self._prof is None and time.perf_counter() - self._t0 >= self.at_s:
                self._begin()
            outputs = step()
            if self._prof is not None:
                self._seen += 1
                self._running_sum += self._running()
                self._live_sum += self._live_tokens()
                if self._seen >= self.steps:
                    self._end()
            return outputs

        return profiled_step

    def finish(self) -> None:
        """End a window the run ended inside of (fewer steps than asked: the summary says how many)."""
        if self._prof is not None:
            self._end()

    def _begin(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        # Device activity only on a GPU: recording every host operator too would slow the host, and the idle
        # share would then measure the profiler.
        activities = [ProfilerActivity.CUDA] if self.on_device else [ProfilerActivity.CPU]
        if self.on_device:
            torch.cuda.synchronize()
        self._prof = profile(activities=activities)
        self._prof.start()
        self._start = time.perf_counter()

    def _end(self) -> None:
        import torch

        if self.on_device:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._start
        prof, self._prof = self._prof, None
        prof.stop()
        self.result = StepProfile(steps=self._seen, wall_s=wall,
                                  kernels=kernel_times(prof.key_averages(), on_device=self.on_device),
                                  running_mean=self._running_sum / max(1, self._seen), on_device=self.on_device,
                                  live_tokens_mean=self._live_sum / max(1, self._seen))
