"""The tiny hybrid with an MTP head (random), so ``regen estimate``'s MTP path runs end to end on the CPU.

    python -m bench.tiny_mtp_head .regen-local/tiny-hybrid-mtp
    regen estimate data/sample --model .regen-local/tiny-hybrid-mtp --sample 16 --max-tokens 32

worker/tiny/hybrid.py's model declares no MTP layer (transformers' ``Qwen3_5ForCausalLM`` has none),
so the estimate says "the model has no MTP head" and probes once. This one declares one
(``mtp_num_hidden_layers: 1``) and carries the ``mtp.*`` tensors vLLM's ``Qwen3_5MTP`` loads: its
decoder layer a copy of the model's full-attention layer, ``fc`` random, its norms zero (Qwen3.5's
RMSNorm scales by 1 + weight). Its drafts are noise, so the acceptance is near 0 and the estimate
finds MTP the dearer: what is checked is the path (vLLM's CPU build drafts, the probe records the
acceptance, the estimate prices both ways and names its choice), not a speed-up.
"""

from __future__ import annotations

import json
from pathlib import Path


def add_mtp_head(model_dir: str | Path, *, seed: int = 0) -> Path:
    """Give the tiny hybrid in ``model_dir`` one MTP layer (config and weights), in place."""
    import torch
    from safetensors.torch import load_file, save_file

    model = Path(model_dir)
    config = json.loads((model / "config.json").read_text())
    weights = load_file(model / "model.safetensors")
    full = config["layer_types"].index("full_attention")
    hidden = config["hidden_size"]
    for name, tensor in list(weights.items()):
        if name.startswith(f"model.layers.{full}."):
            weights[name.replace(f"model.layers.{full}.", "mtp.layers.0.")] = tensor.clone()
    generator = torch.Generator().manual_seed(seed)
    weights["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=generator) * 0.02).to(torch.bfloat16)
    for norm in ("mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
        weights[norm] = torch.zeros(hidden, dtype=torch.bfloat16)
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    config["mtp_num_hidden_layers"] = 1
    (model / "config.json").write_text(json.dumps(config, indent=1))
    return model


if __name__ == "__main__":
    import argparse

    from worker.tiny.hybrid import build_tiny_hybrid

    p = argparse.ArgumentParser(prog="python -m bench.tiny_mtp_head", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="directory to write the model into (created)")
    args = p.parse_args()
    print(add_mtp_head(build_tiny_hybrid(args.out)))
