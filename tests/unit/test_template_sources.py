"""The published templates under tests/data/templates are byte for byte the copies SOURCES.md names.

Each row of SOURCES.md that notes a sha256 for its file is held to it here, so an edit of a copy (a
stray newline, a "fix") fails instead of quietly testing regen against a template no target ships. The
Kimi-K2 and Mistral Small copies were compared with their sources' text as the code search returns it
(2026-12-02: equal); Magistral has no published Jinja template, so its file is what mistral-common
generates for its tokenizer and is regenerated here.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
#: ``| `file.jinja` | ... sha256 `HEX` ...``: the sha256 a row notes for its file (its first one).
_ROW = re.compile(r"^\| `(?P<file>[^`]+\.jinja)` \|(?P<rest>.*)$", re.MULTILINE)
_SHA = re.compile(r"sha256 `([0-9a-f]{64})`")
#: Magistral Small 1.2's system prompt, as its model card gives it (Mistral's SYSTEM_PROMPT.txt).
MAGISTRAL_SYSTEM_PROMPT = (
    "First draft your thinking process (inner monologue) until you arrive at a response. Format your response using "
    "Markdown, and use LaTeX for any mathematical equations. Write both your thoughts and the response in the same "
    "language as the input.\n\nYour thinking process must follow the template below:[THINK]Your thoughts or/and "
    "draft, like working through an exercise on scratch paper. Be as casual and as long as you want until you are "
    "confident to generate the response. Use the same language as the input.[/THINK]Here, provide a "
    "self-contained response.")


def _noted() -> dict[str, list[str]]:
    """file -> the sha256s its SOURCES.md row notes, in order (the file's own first)."""
    text = (TEMPLATES / "SOURCES.md").read_text()
    return {m["file"]: _SHA.findall(m["rest"]) for m in _ROW.finditer(text)}


def _sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def test_every_committed_template_has_a_row_and_the_checked_ones_a_sha256():
    noted = _noted()
    assert set(noted) == {p.name for p in TEMPLATES.glob("*.jinja")}
    for name in ("kimi_k2_instruct.jinja", "kimi_k2_thinking.jinja", "mistral_small31.jinja",
                 "magistral_small2509.jinja", "gpt_oss.jinja", "llama31.jinja", "qwen36.jinja"):
        assert noted[name], f"SOURCES.md notes no sha256 for {name}"


@pytest.mark.parametrize("name", sorted(n for n, shas in _noted().items() if shas))
def test_a_committed_copy_is_byte_for_byte_its_noted_source(name):
    assert _sha((TEMPLATES / name).read_bytes()) == _noted()[name][0]


def test_the_magistral_template_is_what_mistral_common_generates_for_its_tokenizer():
    """Tokenizer v13 (Tekken, [THINK] special tokens, images), the card's system prompt as the default one."""
    chat_templates = pytest.importorskip("mistral_common.integrations.chat_templates.chat_templates")
    from mistral_common.tokens.tokenizers.base import TokenizerVersion

    assert _sha(MAGISTRAL_SYSTEM_PROMPT) == _noted()["magistral_small2509.jinja"][1]
    generated = chat_templates.generate_chat_template(
        spm=False, tokenizer_version=TokenizerVersion.v13, image_support=True, audio_support=False,
        thinking_support=True, default_system_prompt=MAGISTRAL_SYSTEM_PROMPT, plain_thinking_support=False,
        use_special_token_variables=True, model_settings_fields=None, reasoning_effort_values=None,
        reasoning_effort_default=None)
    assert generated == (TEMPLATES / "magistral_small2509.jinja").read_text()
