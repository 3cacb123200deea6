"""A tiny hybrid model: Qwen3.5/3.6's architecture (``Qwen3_5ForCausalLM``), random weights, the tiny tokenizer.

Qwen3.6-27B interleaves three Gated-DeltaNet (linear-attention) layers with one full-attention layer,
64 layers in all; this keeps one such group of four, so every engine path a hybrid takes runs on the
CPU: a recurrent state per sequence beside a KV cache per token, vLLM's page padding, and the engine
args regen picks for it (worker/engine/architecture_args.py, docs/hybrid.md). The linear heads stay
128 wide, as vLLM's CPU Gated-DeltaNet kernel wants them; attention's head_dim 64, as the dense tiny
model's (vLLM's CPU attention needs head_dim >= 32).

The tokenizer and the chat template are the Qwen3 tiny model's (worker/tiny/model.py): what is tested
here is the architecture, not a chat format. Random weights build in seconds, so nothing is cached.
"""

from __future__ import annotations

import os
from pathlib import Path

#: One Qwen3.6 layer group: three Gated-DeltaNet layers, then full attention.
LAYER_TYPES = ("linear_attention", "linear_attention", "linear_attention", "full_attention")


#: The trained family's (worker/tiny/families.py, qwen36): one of each kind. Training a Gated-DeltaNet layer
#: on transformers' reference PyTorch kernels costs ~1.7x an attention layer's step here, and CI trains every
#: family from scratch; the format is what that model is tested for.
TRAINED_LAYER_TYPES = ("linear_attention", "full_attention")


def hybrid_config(tokenizer, *, hidden_size: int = 128, intermediate_size: int = 256,
                  layer_types: tuple[str, ...] = LAYER_TYPES, eos_token: str = "<|im_end|>",
                  pad_token: str = "<|endoftext|>"):
    """The ``qwen3_5_text`` config of the tiny hybrid, over ``tokenizer``."""
    from transformers import Qwen3_5TextConfig

    im_end, eot = tokenizer.convert_tokens_to_ids([eos_token, pad_token])
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=len(layer_types), layer_types=list(layer_types),
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        # 8 K positions, as the dense tiny model: a worker given no --engine-arg sizes its engine by this.
        max_position_embeddings=8192, tie_word_embeddings=True,
        bos_token_id=eot, eos_token_id=im_end, pad_token_id=eot, dtype="bfloat16",
    )
    config.architectures = ["Qwen3_5ForCausalLM"]
    return config


def build_tiny_hybrid(out_dir: str | os.PathLike, *, seed: int = 0) -> Path:
    """Write the tiny hybrid (random weights) into ``out_dir``; loadable offline by transformers and vLLM."""
    from .model import _passive_openmp_waits, save_model_dir, tokenizer_corpus, train_tokenizer

    out = Path(out_dir)
    with _passive_openmp_waits():
        import torch
        from transformers import Qwen3_5ForCausalLM

        tokenizer = train_tokenizer(tokenizer_corpus(seed))
        torch.manual_seed(seed)
        model = Qwen3_5ForCausalLM(hybrid_config(tokenizer)).to(torch.bfloat16).eval()
        save_model_dir(out, model, tokenizer, {"variant": "random", "seed": seed, "family": "qwen3_5_hybrid"})
    return out
