"""From the text a Qwen3-family model generated to an assistant message.

Two steps, each a pure function of the text:

* :func:`split_reasoning` separates the thought (``<think>…</think>``) from the answer.
* :func:`parse_tool_calls` pulls ``<tool_call>`` blocks out of the answer.

Both keep what the model wrote: anomalies (unbalanced think tags, invalid tool-call
JSON) are *reported*, never repaired, because a silently repaired message would put
text in the next turn's context that the model never produced.

Nothing here imports vLLM or a tokenizer: the worker hands in decoded text, decoded
with ``skip_special_tokens=True`` (Qwen3's ``<think>`` and ``<tool_call>`` are
ordinary added tokens, so they survive that decoding).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

#: Qwen3's template writes ``<think>\n`` + thought + ``\n</think>\n\n`` + answer, and its
#: model card strips exactly these newlines when parsing; spaces are the model's own text.
_TEMPLATE_WS = "\n"

# Qwen3.5/3.6 and Qwen3-Coder write calls as XML instead of JSON:
#   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>
_FUNCTION_RE = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ReasoningSplit:
    """One generation split into thought and answer.

    ``reasoning_content`` is None for a non-thinking turn and a string (possibly
    empty) for a thinking turn, so that Qwen3's template never re-splits ``content``.
    """

    reasoning_content: str | None
    content: str
    #: The generation hit max_tokens before ``</think>``: there is no answer at all.
    truncated_in_reasoning: bool
    #: False when think tags are unbalanced or left over in the answer (text kept as generated).
    think_tags_ok: bool


@dataclass(frozen=True)
class ToolCallParse:
    """The answer with its ``<tool_call>`` blocks taken out.

    ``tool_calls`` holds the valid calls in normalised form with ids; ``errors`` holds one
    ``{"index", "error", "raw"}`` entry per invalid block (``index`` counts all blocks,
    valid or not, in order) so nothing the model wrote is lost.
    """

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: The last block has no ``</tool_call>`` (generation cut off or EOS inside a call).
    unterminated: bool = False


def split_reasoning(text: str, *, thinking: bool, finish_reason: str) -> ReasoningSplit:
    """Split generated text into reasoning and answer the way Qwen3's parser does.

    Args:
        text: The completion as decoded by the engine.
        thinking: Whether the turn was rendered with ``enable_thinking=True``. When False
            the prompt already ends with an empty think block and all text is answer.
        finish_reason: The engine's finish reason; ``"length"`` before ``</think>``
            means the thought was cut off and nothing of it may become the answer.

    Returns:
        The split, with flags for truncation inside the thought and for bad think tags.
    """
    if not thinking:
        content = text.strip(_TEMPLATE_WS)
        return ReasoningSplit(
            reasoning_content=None,
            content=content,
            truncated_in_reasoning=False,
            think_tags_ok=THINK_START not in content and THINK_END not in content,
        )

    thought, sep, answer = text.partition(THINK_END)
    # The opening tag is either generated (Qwen3) or already in the prompt (Qwen3.5+,
    # some Qwen3 templates): drop one leading copy, as vLLM's parser does.
    head = thought.lstrip()
    if head.startswith(THINK_START):
        thought = head[len(THINK_START) :]
    tags_ok = THINK_START not in thought

    if not sep:
        # No </think>: the whole generation is thought. Cut off → truncated; a model that
        # chose to *stop* without closing its thought produced a malformed turn.
        return ReasoningSplit(
            reasoning_content=thought.strip(_TEMPLATE_WS),
            content="",
            truncated_in_reasoning=finish_reason == "length",
            think_tags_ok=tags_ok and finish_reason != "stop",
        )

    content = answer.strip(_TEMPLATE_WS)
    tags_ok = tags_ok and THINK_START not in content and THINK_END not in content
    return ReasoningSplit(
        reasoning_content=thought.strip(_TEMPLATE_WS),
        content=content,
        truncated_in_reasoning=False,
        think_tags_ok=tags_ok,
    )


def parse_tool_calls(content: str, *, id_prefix: str = "call_") -> ToolCallParse:
    """Extract ``<tool_call>`` blocks (JSON or Qwen3.5 XML bodies) from an answer.

    Several blocks in one answer are parallel calls, kept in the order written. The
    last block may lack ``</tool_call>``; it is parsed all the same and flagged.

    Args:
        content: The answer part of a generation (after :func:`split_reasoning`).
        id_prefix: Ids are ``f"{id_prefix}{n}"`` with n counting the valid calls;
            the caller makes the prefix unique per turn.

    Returns:
        The text outside the blocks (stripped), the valid calls and one error entry
        per invalid block.
    """
    if TOOL_CALL_START not in content:
        return ToolCallParse(content=content.strip())

    outside: list[str] = []
    calls: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    unterminated = False
    pos = 0
    index = 0
    while True:
        start = content.find(TOOL_CALL_START, pos)
        if start < 0:
            outside.append(content[pos:])
            break
        outside.append(content[pos:start])
        body_start = start + len(TOOL_CALL_START)
        end = content.find(TOOL_CALL_END, body_start)
        if end < 0:
            unterminated = True
            raw, pos = content[start:], len(content)
            body = content[body_start:]
        else:
            pos = end + len(TOOL_CALL_END)
            raw, body = content[start:pos], content[body_start:end]

        try:
            name, arguments = _parse_call_body(body)
        except ValueError as e:
            errors.append({"index": index, "error": str(e), "raw": raw})
        else:
            calls.append(
                {
                    "id": f"{id_prefix}{len(calls)}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        index += 1
        if end < 0:
            break

    return ToolCallParse(
        content="".join(outside).strip(), tool_calls=calls, errors=errors, unterminated=unterminated
    )


def _parse_call_body(body: str) -> tuple[str, dict[str, Any]]:
    """Return (name, arguments) of one block body, or raise ValueError saying what is wrong."""
    stripped = body.strip()
    if not stripped:
        raise ValueError("empty tool_call block")
    if stripped.startswith("<function="):
        return _parse_xml_call(stripped)
    return _parse_json_call(stripped)


def _parse_json_call(body: str) -> tuple[str, dict[str, Any]]:
    """Qwen3 / Hermes form: ``{"name": ..., "arguments": {...}}``."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at char {e.pos}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"call is a JSON {type(obj).__name__}, not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("call has no name")
    if "arguments" not in obj:
        # Qwen3's template always writes "arguments"; a missing key is not what it was
        # trained to produce, and filling in {} would put unseen text in the next context.
        raise ValueError("call has no arguments")
    arguments = obj["arguments"]
    if not isinstance(arguments, dict):
        raise ValueError(f"arguments are a JSON {type(arguments).__name__}, not an object")
    return name, arguments


def _parse_xml_call(body: str) -> tuple[str, dict[str, Any]]:
    """Qwen3.5 / Qwen3-Coder form: ``<function=NAME><parameter=K>V</parameter></function>``.

    Values stay the strings the model wrote: the template re-renders a string argument
    verbatim, so the next turn's context reproduces the model's own text. Converting
    ``true`` to a bool would come back as ``True``.
    """
    match = _FUNCTION_RE.fullmatch(body)
    if match is None:
        raise ValueError("text around <function=...> in tool_call block")
    name = match.group(1).strip()
    if not name:
        raise ValueError("call has no name")
    inner = match.group(2)
    arguments: dict[str, Any] = {}
    for param in _PARAMETER_RE.finditer(inner):
        key = param.group(1).strip()
        if not key:
            raise ValueError("parameter has no name")
        if key in arguments:
            raise ValueError(f"duplicate parameter {key!r}")
        arguments[key] = _trim_one_newline(param.group(2))
    if _PARAMETER_RE.sub("", inner).strip():
        raise ValueError("text outside <parameter=...> in function body")
    return name, arguments


def _trim_one_newline(value: str) -> str:
    """Undo the template's ``>\\n`` … ``\\n<`` around a parameter value, nothing more."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value
