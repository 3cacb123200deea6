"""The tiny model's architecture: its Qwen3 config, random weights and generation config.

Its own module so that the builder (model.py) and the trainer (training.py) both
import it and neither imports the other at module level: no import circle.
"""

from __future__ import annotations


def model_config(tokenizer, *, hidden_size: int = 128, num_layers: int = 2, num_heads: int = 2,
                 num_kv_heads: int = 1, intermediate_size: int = 256):
    """The Qwen3 config of the tiny model.

    head_dim stays 64: vLLM's CPU attention needs head_dim >= 32, and 64 is what
    its kernels are tuned for. 8 K positions fit the longest outputs we test.
    """
    from transformers import Qwen3Config

    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=64,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
        dtype="bfloat16",
    )


def decoder_class(config):
    """Qwen3ForCausalLM, or Qwen3_5ForCausalLM for a hybrid's ``qwen3_5_text`` config (worker/tiny/hybrid.py)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3ForCausalLM

    return Qwen3_5ForCausalLM if config.model_type == "qwen3_5_text" else Qwen3ForCausalLM


def random_model(config, seed: int = 0):
    """The config's decoder (``decoder_class``) with seeded random weights, in bfloat16."""
    import torch

    torch.manual_seed(seed)
    model = decoder_class(config)(config)
    return model.to(torch.bfloat16).eval()


def generation_config(tokenizer):
    """Qwen3's recommended sampling for thinking mode; both end tokens stop generation."""
    from transformers import GenerationConfig

    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return GenerationConfig(
        bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot,
        do_sample=True, temperature=0.6, top_p=0.95, top_k=20,
    )
