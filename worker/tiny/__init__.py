"""An offline tiny Qwen3 model for the demo, the tests and smoke tests (``regen tiny-model``).

model.py builds and caches it (tokenizer, template, weights); architecture.py is its
Qwen3 config; data.py generates synthetic conversations; training.py trains the
``trained`` and ``stub`` variants. templates/ holds the chat template.
"""
