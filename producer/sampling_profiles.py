"""Sampling per thinking mode: the model's generation_config.json for the mode it describes, published values for the
other, the run's flags over both and each mode's own profile over its mode.

Hybrid models publish different sampling for thinking and non-thinking generation, and ship only one of them in
``generation_config.json`` (Qwen3.6-27B's: temperature 1.0, top_p 0.95, top_k 20, its thinking mode's). A run that
mixes modes with one sampling dict samples half its rows off-profile. So a run has one profile per mode it
generates; each row records the one it used (worker/conversation/generation.py).

The published values (docs/design.md cites where they are from) are known for the families below, named by what
rendering their template shows (targets/template_probe.py: family and call format); another family's other mode
gets the same values as the one its generation_config.json describes, as before profiles existed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ledger.errors import ConfigError

#: Keys a profile may set: vLLM's SamplingParams names (worker/conversation/generation.py ENGINE_SAMPLING_KEYS).
PROFILE_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty")
#: Penalties are recorded only where set: every run recorded before they existed keeps its hash.
PENALTY_KEYS = ("presence_penalty", "frequency_penalty")

#: (family, tool parser) -> {mode: values}, as the model cards publish them.
PUBLISHED: dict[tuple[str, str], dict[str, dict[str, float]]] = {
    # Qwen3.5 / Qwen3.6 (qwen3_coder calls): Qwen3.6-27B's card, "Best practices" (thinking, general tasks;
    # instruct / non-thinking mode, general tasks).
    ("qwen3", "qwen3_coder"): {
        "on": {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0,
               "repetition_penalty": 1.0},
        "off": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5,
                "repetition_penalty": 1.0},
    },
    # Qwen3 (hermes calls): Qwen3's cards, "Best practices" (thinking; non-thinking).
    ("qwen3", "hermes"): {
        "on": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
        "off": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0},
    },
}


def parse_profile(text: str | None, option: str) -> dict[str, float]:
    """A profile from its option's JSON object; unknown keys and values of the wrong type are refused by name."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{option} must be a JSON object of sampling values: {e}") from e
    if not isinstance(value, Mapping):
        raise ConfigError(f"{option} must be a JSON object of sampling values, not {text!r}")
    unknown = sorted(set(value) - set(PROFILE_KEYS))
    if unknown:
        raise ConfigError(f"{option}: unknown sampling key(s) {unknown}; known: {list(PROFILE_KEYS)}")
    for key, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{option}: {key} must be a number, not {v!r}")
    return dict(value)


def described_mode(thinking_kind: str | None) -> str:
    """The mode a model's generation_config.json samples for: its template's default (on where it thinks)."""
    return "off" if thinking_kind == "never" else "on"


def mode_profiles(base: dict, generation: dict, *, family: str | None, tool: str | None, thinking_kind: str | None,
                  flags: dict, own: dict[str, dict]) -> dict[str, dict]:
    """``{"on": values, "off": values}``: each mode's sampling.

    Args:
        base: vLLM's defaults (what applies where nothing else says).
        generation: the model's generation_config.json values, for the mode it describes.
        family, tool: what rendering the template shows; they name the published values of the other mode.
        thinking_kind: the template's "switch", "always", "never" (None: not readable here).
        flags: ``--temperature`` and the like: over both modes.
        own: ``{"on": --sampling-thinking, "off": --sampling-no-thinking}``: over their mode.
    """
    described = described_mode(thinking_kind)
    published = PUBLISHED.get((family or "", tool or ""), {})
    out = {}
    for mode in ("on", "off"):
        values = dict(generation) if mode == described else dict(published.get(mode) or generation)
        out[mode] = {**base, **values, **flags, **own.get(mode, {})}
    for mode, values in out.items():
        if values["temperature"] < 0 or not 0 < values["top_p"] <= 1:
            raise ConfigError(f"{'thinking' if mode == 'on' else 'no-thinking'} sampling: temperature must be >= 0 "
                              "and top_p in (0, 1]")
        for key in PENALTY_KEYS:
            if key in values and not -2.0 <= values[key] <= 2.0:
                raise ConfigError(f"{key} must be between -2 and 2 (vLLM's range), got {values[key]}")
            if values.get(key) == 0.0 and key not in flags and key not in own.get(mode, {}):
                values.pop(key)  # vLLM's default: left out of the record, so older runs keep their hash
    return out
