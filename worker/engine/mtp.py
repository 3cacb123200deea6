"""The target's own MTP head as vLLM's speculative decoding: the engine arguments, the acceptance, the choice.

Qwen3.6-27B ships one MTP layer (``mtp_num_hidden_layers: 1``): a small head that drafts the next token
from the trunk's last hidden state, which vLLM runs as ``speculative_config={"method": "mtp", ...}``
(0.26 and 0.32 both take ``mtp``; ``qwen3_5_mtp``, the model's own name, is mapped to it with a
deprecation warning). Each step the head drafts ``num_speculative_tokens`` tokens, the target scores
them all in one pass, and vLLM's rejection sampler keeps a prefix of them.

Why the output is still the target's: with ``rejection_sample_method="standard"`` a drafted token x is
kept with probability ``min(1, p(x) / q(x))`` and on a rejection the token is drawn from the residual
``max(0, p - q)`` renormalised, which makes every emitted token a draw from the target's ``p`` at the
request's own temperature, top-p and top-k (the speculative sampling theorem). regen asks for
``draft_sample_method="probabilistic"``: the draft is sampled from the head's own distribution ``q``
and the ratio uses its full probabilities, which accepts more at temperature > 0 than a greedy draft
(whose ``q`` is one-hot; lossless too, but it accepts x only with probability ``p(x)``). Never
"synthetic": that method accepts at a calibrated rate whatever ``p`` says, a benchmark device, not
the target's distribution. Seeded requests keep their own generators in the rejection sampler, so a
run stays reproducible; its tokens differ from a run without MTP for the same seed (other random
draws), which is why the choice is part of the run's config hash (producer/run_config.py).

What it costs: the head's weights (~0.43 B parameters for the 27B), its attention layer's KV beside
the trunk's, a wider conv state and one more state block per group a sequence
(worker/engine/cache_plan.py), so fewer sequences fit; what it buys is up to ``1 + k`` tokens per
target step. Whether that is cheaper depends on the acceptance, so ``regen estimate`` measures both
(docs/estimate.md, "MTP").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ledger.errors import ConfigError

#: vLLM's name for a model's own MTP head (0.26-0.33).
MTP_METHOD = "mtp"
#: Tokens drafted per step when MTP is asked for without a number: the published vLLM deployments of
#: Qwen3.5/3.6-27B draft 2 (vLLM-Ascend's Qwen3.6-27B guide: ``{"method": "qwen3_next_mtp",
#: "num_speculative_tokens": 2}``). A choice to measure, not tuned here.
DEFAULT_MTP_TOKENS = 2


def mtp_layers(config: dict[str, Any]) -> int:
    """The MTP layers a config.json declares (a multimodal checkpoint's ``text_config`` read too)."""
    text = config.get("text_config") or {}
    return int(config.get("mtp_num_hidden_layers") or text.get("mtp_num_hidden_layers")
               or config.get("num_nextn_predict_layers") or text.get("num_nextn_predict_layers") or 0)


def speculative_config(tokens: int) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for the target's own MTP head drafting ``tokens`` a step, lossless."""
    if tokens < 1:
        raise ConfigError(f"MTP drafts at least 1 token a step, not {tokens}")
    return {"method": MTP_METHOD, "num_speculative_tokens": int(tokens),
            "draft_sample_method": "probabilistic", "rejection_sample_method": "standard"}


def mtp_engine_args(tokens: int) -> dict[str, Any]:
    """Engine arguments that turn MTP on (``tokens`` > 0), or nothing."""
    return {"speculative_config": speculative_config(tokens)} if tokens else {}


def mtp_engine_arg_pairs(tokens: int) -> list[str]:
    """The same as ``--engine-arg key=value`` pairs (worker/engine/args.py reads them back)."""
    return [f"{key}={json.dumps(value)}" for key, value in mtp_engine_args(tokens).items()]


def mtp_tokens_of(engine_args: dict[str, Any]) -> int:
    """Tokens drafted a step by an engine built with ``engine_args`` (0: no MTP)."""
    spec = engine_args.get("speculative_config")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            return 0
    if isinstance(spec, dict) and spec.get("method") in (MTP_METHOD, "qwen3_5_mtp", "qwen3_next_mtp"):
        return int(spec.get("num_speculative_tokens") or 0)
    return 0


def parse_mtp(value: str | int | None) -> int | None:
    """``--mtp``: "off" or 0 (none), "auto" (None: the estimate decides), or the tokens drafted a step.

    Raises:
        ConfigError: anything else.
    """
    if value is None or str(value).strip().lower() == "auto":
        return None
    text = str(value).strip().lower()
    if text in ("off", "0", "no", "false"):
        return 0
    if text in ("on", "yes", "true"):
        return DEFAULT_MTP_TOKENS
    try:
        tokens = int(text)
    except ValueError as e:
        raise ConfigError(f"--mtp takes off, auto, on or the tokens drafted a step (1-8), not {value!r}") from e
    if not 0 <= tokens <= 8:
        raise ConfigError(f"--mtp drafts 1 to 8 tokens a step (0: off), not {tokens}")
    return tokens


class AcceptanceRecorder:
    """Sums vLLM's speculative-decoding stats (drafted and accepted tokens) over an engine's steps.

    Hung beside the engine's stat loggers (worker/engine/stats.py ``attach``) by the estimate's MTP probe.
    """

    def __init__(self) -> None:
        self.drafts = self.drafted = self.accepted = 0

    def record(self, scheduler_stats: Any = None, iteration_stats: Any = None, *args: Any, **kwargs: Any) -> None:
        spec = getattr(scheduler_stats, "spec_decoding_stats", None)
        if spec is not None:
            self.drafts += int(getattr(spec, "num_drafts", 0) or 0)
            self.drafted += int(getattr(spec, "num_draft_tokens", 0) or 0)
            self.accepted += int(getattr(spec, "num_accepted_tokens", 0) or 0)

    def log_engine_initialized(self) -> None:  # vLLM calls it on every logger
        pass

    def as_record(self) -> dict[str, Any]:
        rate = self.accepted / self.drafted if self.drafted else None
        per_step = 1 + self.accepted / self.drafts if self.drafts else None
        return {"drafted_tokens": self.drafted, "accepted_tokens": self.accepted,
                "acceptance_rate": round(rate, 4) if rate is not None else None,
                "tokens_per_target_step": round(per_step, 3) if per_step is not None else None}


@dataclass(frozen=True)
class MtpChoice:
    """Whether a run uses MTP, and why: what ``regen estimate`` prints and a run's provenance records."""

    tokens: int
    reason: str
    #: Output tokens/s without and with MTP where both were measured.
    rate_without: float | None = None
    rate_with: float | None = None
    acceptance_rate: float | None = None

    @property
    def on(self) -> bool:
        return self.tokens > 0

    def as_record(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "on": self.on, "reason": self.reason, "tokens_per_s_without": self.rate_without,
                "tokens_per_s_with": self.rate_with, "acceptance_rate": self.acceptance_rate}

    def line(self) -> str:
        return f"MTP {'on, ' + str(self.tokens) + ' tokens drafted a step' if self.on else 'off'}: {self.reason}"


def choose_mtp(asked: int | None, *, model_layers: int, rate_without: float | None,
               mtp_probe: dict[str, Any] | None, tokens: int = DEFAULT_MTP_TOKENS) -> MtpChoice:
    """The run's MTP choice from what was asked (None: auto, 0: off, k: on) and what the probes measured.

    ``mtp_probe``: the MTP probe's results (its ``tokens_per_s`` and ``mtp`` record), or its
    ``{"error": ...}`` where its engine could not be built, or None where none ran.
    """
    if asked == 0:
        return MtpChoice(0, "off as asked (--mtp off)", rate_without)
    if model_layers < 1:
        if asked:
            raise ConfigError("--mtp: the model declares no MTP layer (mtp_num_hidden_layers), so it has no head "
                              "to draft with")
        return MtpChoice(0, "the model has no MTP head (its config declares no mtp_num_hidden_layers)", rate_without)
    k = asked or tokens
    if mtp_probe is None:
        if asked:
            return MtpChoice(k, f"on as asked (--mtp {k}); not measured (no probe ran)", rate_without)
        return MtpChoice(0, "not measured (no probe ran), so priced without it", rate_without)
    if mtp_probe.get("error"):
        return MtpChoice(0, f"MTP could not run here ({mtp_probe['error']}), so it is priced without it",
                         rate_without)
    rate_with = mtp_probe.get("tokens_per_s")
    acceptance = (mtp_probe.get("mtp") or {}).get("acceptance_rate")
    if asked:
        return MtpChoice(k, f"on as asked (--mtp {k})", rate_without, rate_with, acceptance)
    if not rate_with or not rate_without:
        return MtpChoice(0, "the probes measured no rate to compare, so priced without it", rate_without, rate_with,
                         acceptance)
    ratio = rate_with / rate_without
    accepted = f"{acceptance:.0%} of drafted tokens accepted" if acceptance is not None else "acceptance not reported"
    if ratio > 1:
        return MtpChoice(k, f"{rate_with:,.0f} tok/s with it against {rate_without:,.0f} without ({ratio:.2f}x; "
                         f"{accepted}): the cheaper", rate_without, rate_with, acceptance)
    return MtpChoice(0, f"{rate_with:,.0f} tok/s with it against {rate_without:,.0f} without ({ratio:.2f}x; "
                     f"{accepted}): off is the cheaper", rate_without, rate_with, acceptance)
