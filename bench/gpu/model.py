"""The GPU benchmark's models: Qwen3-8B or -32B shapes over regen's tiny tokenizer and template, no weights.

    python -m bench.gpu.model .gpu-carry/q8b                 # --shape 8b, the default
    python -m bench.gpu.model .gpu-carry/q32b --shape 32b    # the seed's regime (issue 31)

Built here (seconds) and carried (a few hundred KB): the tiny random model's
tokenizer, chat template and generation config, with a config.json of Qwen3-8B's
shapes (36 layers, hidden 4,096, 32 query and 8 KV heads of 128) and the tiny
vocabulary. vLLM loads it with ``load_format=dummy`` (random weights made on the
GPU), so an 8B model's compute and KV cache cost are measured without 16 GB of files.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

#: Qwen3-8B's published shapes; the vocabulary stays the tiny tokenizer's.
QWEN3_8B_SHAPES = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                   "max_position_embeddings": 40960, "tie_word_embeddings": False}
#: Qwen3-32B's: a dense 27-32B target like the seed's (Qwen3.6-27B), 62 GB of bf16 weights, 256 KiB of KV a token.
QWEN3_32B_SHAPES = {**QWEN3_8B_SHAPES, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                    "num_attention_heads": 64}
SHAPES = {"8b": QWEN3_8B_SHAPES, "32b": QWEN3_32B_SHAPES}


def build(out_dir: str | Path, shape: str = "8b") -> Path:
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
    config.update(SHAPES[shape])
    config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]  # one per layer
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.gpu.model", description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=".gpu-carry/q8b")
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    args = p.parse_args()
    print(build(args.out, args.shape))
