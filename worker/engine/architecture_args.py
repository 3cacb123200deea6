"""Engine arguments the model's own config calls for: a hybrid's caching on each platform, text only.

regen's defaults (worker/engine/host.py) are sized for dense attention models. Two kinds of
model need more, read off their config.json before the engine is built (docs/hybrid.md):

- A hybrid (Qwen3.5/3.6's Gated-DeltaNet layers, any layer type vLLM keeps a recurrent state
  for): with prefix caching vLLM caches the state in its "align" mode, which asserts chunked
  prefill ("Chunked prefill is required for mamba cache mode 'align'"). On GPUs chunked prefill
  is vLLM's default, so regen's prefix caching stands. On vLLM's CPU build regen turns chunked
  prefill off (a seeded request whose prompt is chunked crashes it), so it turns prefix caching
  off for a hybrid there: correct and slower, never a crash.
- A multimodal checkpoint (a ``vision_config``: Qwen3.5/3.6's published
  ``Qwen3_5ForConditionalGeneration``): regen sends text only, so the engine is built
  ``language_model_only``: no vision encoder in memory, no image processor at run time.

The user's ``--engine-arg``s are laid over these, as over every default.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Layer types of attention, whose cache is per token; any other type in ``layer_types``
#: (``linear_attention``, ``mamba``, ...) keeps a per-sequence state: the model is a hybrid.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "attention", "chunked_attention"})


def read_model_config(model: str | Path | None) -> dict[str, Any] | None:
    """The model folder's config.json, or None where there is none to read (a hub id, a missing folder).

    A missing or unreadable folder is left to vLLM, which names the path in its own error
    (worker/engine/build_errors.py then stops the worker).
    """
    if model is None:
        return None
    path = Path(model) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (``text_config`` of a multimodal one, else the config)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def is_hybrid(config: dict[str, Any]) -> bool:
    """Whether some layer keeps a per-sequence state instead of a per-token KV cache.

    ``layer_types`` says it where the config lists it; a Qwen3-Next/3.5-style config may leave the list to
    transformers, which derives it from ``full_attention_interval`` (every n-th layer attention, the
    others linear): such a config is a hybrid too."""
    text = text_config(config)
    layer_types = text.get("layer_types") or []
    if layer_types:
        return any(kind not in ATTENTION_LAYER_TYPES for kind in layer_types)
    interval = text.get("full_attention_interval")
    return isinstance(interval, int) and interval > 1 and int(text.get("num_hidden_layers") or 0) > 1


def is_multimodal(config: dict[str, Any]) -> bool:
    """Whether the checkpoint carries an encoder regen never feeds (a vision tower)."""
    return isinstance(config.get("vision_config"), dict)


def architecture_engine_args(config: dict[str, Any] | None, *, on_cpu: bool) -> dict[str, Any]:
    """The engine args ``config``'s architecture needs on this platform, over regen's defaults ({} for a dense text model)."""
    if not config:
        return {}
    args: dict[str, Any] = {}
    if is_multimodal(config):
        args["language_model_only"] = True
    if is_hybrid(config) and on_cpu:
        # vLLM's CPU build: prefix caching would need chunked prefill (the "align" state cache),
        # which crashes seeded requests there (host.py's CPU_ENGINE_ARGS).
        args["enable_prefix_caching"] = False
    return args
