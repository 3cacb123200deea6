"""A model folder as ``regen submit`` reads it (config, tokenizer, chat template), without weights."""

from __future__ import annotations

import json
from pathlib import Path

#: The tiny model's chat template (worker/tiny/model.py TEMPLATE_PATH), read without importing the model builder.
TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "worker" / "tiny" / "templates" / "qwen3_chat.jinja"

#: The smallest tokenizer the ``tokenizers`` library loads: one word-level token.
_TOKENIZER = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
              "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
              "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}


def write_model_folder(path: Path, *, chat_template: str | None = None) -> Path:
    """Write config.json, tokenizer.json and tokenizer_config.json (the tiny model's Qwen3 template by default)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}))
    (path / "tokenizer.json").write_text(json.dumps(_TOKENIZER))
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}
    config["chat_template"] = TEMPLATE_PATH.read_text() if chat_template is None else chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path
