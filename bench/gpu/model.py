"""The GPU benchmark's model: Qwen3-8B shapes over regen's tiny tokenizer and chat template, no weights.

    python -m bench.gpu.model .gpu-carry/q8b

Built here (seconds) and carried (a few hundred KB): the tiny random model's
tokenizer, chat template and generation config, with a config.json of Qwen3-8B's
shapes (36 layers, hidden 4,096, 32 query and 8 KV heads of 128) and the tiny
vocabulary. vLLM loads it with ``load_format=dummy`` (random weights made on the
GPU), so an 8B model's compute and KV cache cost are measured without 16 GB of files.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

#: Qwen3-8B's published shapes; the vocabulary stays the tiny tokenizer's.
QWEN3_8B_SHAPES = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                   "max_position_embeddings": 40960, "tie_word_embeddings": False}


def build(out_dir: str | Path) -> Path:
    from worker.tiny.model import build_tiny_model

    out = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_model(Path(tmp) / "tiny", variant="random")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for f in tiny.iterdir():
            if f.is_file() and not f.name.endswith((".safetensors", ".bin")) and f.name != "model.safetensors.index.json":
                shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    config.update(QWEN3_8B_SHAPES)
    config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]  # one per layer
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else ".gpu-carry/q8b"))
