"""Offline tiny models of nine chat families for the demo, the tests and smoke tests (``regen tiny-model``).

model.py builds and caches the Qwen3 one (tokenizer, template, weights); architecture.py
is its Qwen3 config; data.py generates synthetic conversations; training.py trains the
``trained`` and ``stub`` variants. families.py describes the families (qwen3, llama3,
deepseek_r1, glm45, kimi_k2, mistral, magistral, gpt_oss, qwen36: tokens, templates, vLLM parsers) and
family_model.py builds any of them (harmony_model.py the gpt-oss one; qwen36 on hybrid.py's Qwen3.5
architecture). templates/ holds the chat templates.
"""

from .families import FAMILIES
from .family_model import build_tiny_model

__all__ = ["FAMILIES", "build_tiny_model"]
