"""The GPU benchmark's models: Qwen3-8B, -32B or Qwen3.6-27B shapes over regen's tiny tokenizer and template, no weights.

    python -m bench.gpu.model .gpu-carry/q8b                 # --shape 8b, the default
    python -m bench.gpu.model .gpu-carry/q32b --shape 32b    # the seed's regime (issue 31)
    python -m bench.gpu.model .gpu-carry/q36 --shape q36     # the users' target: Qwen3.6-27B's hybrid text model
    python -m bench.gpu.model .gpu-carry/q36m --shape q36-mtp  # the same under the published top-level config
    python -m bench.gpu.model /tmp/q36m --shape q36-mtp --nest-from .gpu-carry/q36   # that, from a q36 (no build)

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
#: Qwen3.6-27B's published text config (``Qwen3_5ForConditionalGeneration``'s ``text_config``, model type
#: ``qwen3_5_text``), loaded text-only as ``Qwen3_5ForCausalLM``: 64 layers, every 4th full attention (16 layers,
#: 24 query / 4 KV heads of 256: 64 KiB of bf16 KV a token), the other 48 Gated DeltaNet (16 key / 48 value
#: heads of 128, conv kernel 4, fp32 recurrent state: ~3 MiB a layer a sequence), one MTP layer. The
#: vocabulary stays the tiny tokenizer's: the published 248,320-row embedding and LM head (2.5 GB of bf16)
#: are left out, so the bound printed for this shape is the trunk's.
QWEN36_27B_TEXT = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
    "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "full_attention_interval": 4, "attn_output_gate": True, "attention_bias": False, "hidden_act": "silu",
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 48, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
    "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False, "partial_rotary_factor": 0.25,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                        "rope_theta": 10000000, "rope_type": "default"},
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}
SHAPES = {"8b": QWEN3_8B_SHAPES, "32b": QWEN3_32B_SHAPES, "q36": QWEN36_27B_TEXT, "q36-mtp": QWEN36_27B_TEXT}
#: Shapes written under the published checkpoint's top-level config (model type ``qwen3_5``, the text model's
#: fields in ``text_config``), still loaded as the text-only ``Qwen3_5ForCausalLM``: vLLM finds a Qwen3.5/3.6
#: MTP head only under that model type (its speculative config maps ``qwen3_5`` to ``qwen3_5_mtp``).
NESTED = {"q36-mtp"}


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
    if shape in ("q36", "q36-mtp"):
        for dense_only in ("layer_types", "sliding_window", "max_window_layers", "use_sliding_window", "rope_theta",
                           "rope_scaling"):
            config.pop(dense_only, None)
        every = config["full_attention_interval"]
        config["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                                 for i in range(config["num_hidden_layers"])]
    else:
        config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]  # one per layer
    if shape in NESTED:
        config = nested(config)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def nested(text_config: dict) -> dict:
    """A text model's config.json under the published top-level one (model type ``qwen3_5``), same architecture."""
    text = {k: v for k, v in text_config.items() if k not in ("architectures", "transformers_version")}
    return {"architectures": text_config["architectures"], "model_type": "qwen3_5", "text_config": text,
            "tie_word_embeddings": text["tie_word_embeddings"], "vocab_size": text["vocab_size"]}


def nest_copy(text_dir: str | Path, out_dir: str | Path) -> Path:
    """``text_dir``'s model with its config nested (:func:`nested`): where no tiny model can be built (the GPU
    machine), the q36-mtp form from a carried q36 folder."""
    out = Path(out_dir)
    shutil.copytree(text_dir, out, dirs_exist_ok=True)
    (out / "config.json").write_text(json.dumps(nested(json.loads((Path(text_dir) / "config.json").read_text())),
                                                indent=1))
    return out


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.gpu.model", description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=".gpu-carry/q8b")
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--nest-from", metavar="DIR", help="q36-mtp only: copy this q36 folder, its config nested")
    args = p.parse_args()
    print(nest_copy(args.nest_from, args.out) if args.nest_from else build(args.out, args.shape))
