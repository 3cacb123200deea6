"""What ``regen estimate`` is asked: the sample, the engines, the probe's settings and where the tokens/s comes from."""

from __future__ import annotations

from dataclasses import dataclass, field

from ledger.errors import ConfigError

from . import arithmetic as em

#: Longest a probe may take, by default: engine load plus a few thousand conversations.
PROBE_TIMEOUT_S = 6 * 3600.0


@dataclass(frozen=True)
class ThroughputChoice:
    """Where the tokens/s used for the hours comes from (exactly one, or none with lengths only)."""

    tokens_per_s: float | None = None            #: --tokens-per-s: measured elsewhere
    gpu_type: str | None = None                  #: --gpu-type: extrapolated by bandwidth from...
    reference_tokens_per_s: float | None = None  #: ...this measurement...
    reference_gpu: str | None = None             #: ...on this GPU type
    lengths_only: bool = False                   #: report tokens only

    def check(self) -> None:
        if self.tokens_per_s is not None and self.tokens_per_s <= 0:
            raise ConfigError("--tokens-per-s must be positive")
        if self.gpu_type is not None:
            if self.tokens_per_s is not None:
                raise ConfigError("give --tokens-per-s or --gpu-type, not both")
            if self.reference_tokens_per_s is None or self.reference_gpu is None:
                raise ConfigError("--gpu-type needs a measurement to scale: --reference-tokens-per-s X "
                                  "--reference-gpu TYPE (tokens/s of one engine on that GPU)")
            if self.reference_tokens_per_s <= 0:
                raise ConfigError("--reference-tokens-per-s must be positive")
            for gpu in (self.gpu_type, self.reference_gpu):
                if gpu not in em.GPU_BANDWIDTH_TBPS:
                    raise ConfigError(f"unknown GPU type {gpu!r}; known: {', '.join(em.GPU_BANDWIDTH_TBPS)}")
        elif self.reference_tokens_per_s is not None or self.reference_gpu is not None:
            raise ConfigError("--reference-tokens-per-s/--reference-gpu go with --gpu-type")


@dataclass(frozen=True)
class EstimateOptions:
    sample_size: int = 1000
    engines: int = 1
    draw_seed: int = 0
    throughput: ThroughputChoice = field(default_factory=ThroughputChoice)
    #: vLLM engine arguments for the probe, ``key=value``: give the workers' own.
    engine_args: tuple[str, ...] = ()
    #: Conversations the probe keeps in the engine; None: the engine's max_num_seqs (full).
    in_flight: int | None = None
    #: Reuse this probe results file if it exists; else write the probe's results there.
    probe_results: str | None = None
    #: The probe's settled phase over its samples' phase (None: the probe's default, as long again).
    settled_share: float | None = None
    probe_timeout_s: float = PROBE_TIMEOUT_S
    #: ``--mtp``: None (auto: measured both ways where the model has an MTP head, the cheaper chosen),
    #: 0 (off) or the tokens its head drafts a step (on, as told; worker/engine/mtp.py).
    mtp: int | None = None
    bootstrap_resamples: int = em.BOOTSTRAP_RESAMPLES
