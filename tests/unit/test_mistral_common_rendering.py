"""regen renders Mistral targets with their Jinja chat template, checked against mistral_common's own encoding.

`vllm serve` on an official Mistral repository uses tokenizer mode ``mistral``: mistral_common
encodes the request. regen renders every target with its chat template through transformers
(worker/conversation/rendering.py), Mistral's included (docs/design.md, "Mistral: the template, not
mistral_common"). These tests hold the two side by side on the tokenizers mistral_common ships and
the templates mistral_common generates for them (Mistral's repositories publish those): the same
conversation (system prompt, tools, a call with its 9-alphanumeric id, its result, an answer, a
second question) gives the same prompt, token for token on Tekken, except one difference that is
pinned here so that a change in either shows: before v7, mistral_common parses a tool result that is
JSON text and writes it as an object, where the template quotes it as a string.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

mistral_common = pytest.importorskip("mistral_common")

from mistral_common.integrations.chat_templates.chat_templates import (  # noqa: E402
    convert_tokenizer_to_chat_template,
)
from mistral_common.protocol.instruct.request import ChatCompletionRequest  # noqa: E402
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy  # noqa: E402
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # noqa: E402

DATA = Path(mistral_common.__file__).parent / "data"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def conversation(result: str) -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abcDEF123", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather", "content": result},
        {"role": "assistant", "content": "12 C."},
        {"role": "user", "content": "And Rome?"},
    ]


@functools.cache
def _tokenizer(tokenizer_file: str) -> tuple[MistralTokenizer, str]:
    """The tokenizer and the chat template mistral_common generates for it (loading Tekken takes seconds)."""
    path = str(DATA / tokenizer_file)
    return MistralTokenizer.from_file(path), convert_tokenizer_to_chat_template(path)


def _both(tokenizer_file: str, messages: list[dict]) -> tuple[MistralTokenizer, list[int], str]:
    """mistral_common's ids for the request, and the prompt its generated template renders (as regen renders)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    tokenizer, template = _tokenizer(tokenizer_file)
    ids = tokenizer.encode_chat_completion(ChatCompletionRequest(messages=messages, tools=TOOLS)).tokens
    rendered, _ = render_jinja_template(conversations=[messages], tools=TOOLS, chat_template=template,
                                        add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    return tokenizer, ids, rendered[0]


def _tekken_ids(tokenizer: MistralTokenizer, text: str) -> list[int]:
    """``text`` as ids: each control token its own id, the text between them encoded (as mistral_common does)."""
    inner = tokenizer.instruct_tokenizer.tokenizer
    specials = {inner.id_to_piece(i): i for i in range(inner.num_special_tokens)}
    pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True) if s) + ")"
    ids: list[int] = []
    for piece in re.split(pattern, text):
        if piece in specials:
            ids.append(specials[piece])
        elif piece:
            ids.extend(inner.encode(piece, bos=False, eos=False))
    return ids


def test_v7_the_template_renders_what_mistral_common_encodes():
    """Tokenizer v7 (Mistral Large 2411's, [TOOL_RESULTS] ID [TOOL_CONTENT] ...): the same text, JSON result or not."""
    for result in ('{"temp": 12}', "sunny"):
        tokenizer, ids, rendered = _both("mistral_instruct_tokenizer_241114.model.v7", conversation(result))
        decoded = tokenizer.instruct_tokenizer.tokenizer.decode(ids, special_token_policy=SpecialTokenPolicy.KEEP)
        # SentencePiece pieces: "▁" is the space, <0x0A> the newline.
        assert decoded.replace("▁", " ").replace("<0x0A>", "\n") == rendered, result


def test_tekken_v3_ids_are_the_same_but_for_a_json_tool_result():
    """Tekken v3 (Mistral Nemo's): token for token equal for a text result; for a JSON one mistral_common writes
    the object, the template the quoted string."""
    tokenizer, ids, rendered = _both("tekken_240911.json", conversation("sunny"))
    assert _tekken_ids(tokenizer, rendered) == ids
    assert '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]</s>' in rendered

    tokenizer, ids, rendered = _both("tekken_240911.json", conversation('{"temp": 12}'))
    assert '{"content": "{\\"temp\\": 12}", "call_id": "abcDEF123"}' in rendered
    encoded = tokenizer.instruct_tokenizer.tokenizer.decode(ids, special_token_policy=SpecialTokenPolicy.KEEP)
    assert '{"content": {"temp": 12}, "call_id": "abcDEF123"}' in encoded
    assert encoded == rendered.replace('"{\\"temp\\": 12}"', '{"temp": 12}')


def test_mistral_common_refuses_the_ids_regen_used_to_write_and_takes_regens_own():
    """The rule regen's ids follow (targets/call_ids.py) is mistral_common's: 9 alphanumerics."""
    from mistral_common.exceptions import InvalidMessageStructureException, MistralCommonException

    from targets.call_ids import derived_id

    tokenizer, _ = _tokenizer("tekken_240911.json")
    bad = conversation("sunny")
    bad[2]["tool_calls"][0]["id"] = bad[3]["tool_call_id"] = "call_0_0"
    with pytest.raises((InvalidMessageStructureException, MistralCommonException, ValueError)):
        tokenizer.encode_chat_completion(ChatCompletionRequest(messages=bad, tools=TOOLS))
    good = conversation("sunny")
    good[2]["tool_calls"][0]["id"] = good[3]["tool_call_id"] = derived_id("sample-1", 0, 0)
    assert tokenizer.encode_chat_completion(ChatCompletionRequest(messages=good, tools=TOOLS)).tokens


@pytest.mark.parametrize("version", ["v3", "v7", "v11", "v13"])
def test_every_template_mistral_common_generates_is_placed_as_mistral_by_rendering(version):
    """JSON-list calls (v3-v7, with or without a space), NAME[CALL_ID]ID[ARGS] (v11) and NAME[ARGS] (v13)."""
    from mistral_common.integrations.chat_templates.chat_templates import generate_chat_template
    from mistral_common.tokens.tokenizers.base import TokenizerVersion

    from targets.template_probe import probe_template

    template = generate_chat_template(
        spm=False, tokenizer_version=TokenizerVersion(version), image_support=False, audio_support=False,
        thinking_support=False, default_system_prompt=None, plain_thinking_support=False,
        use_special_token_variables=True, model_settings_fields=None, reasoning_effort_values=None,
        reasoning_effort_default=None)
    found = probe_template(template)
    assert (found.family, found.reasoning, found.tool, found.thinking) == ("mistral", None, "mistral", "never")
