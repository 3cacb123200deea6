"""Strict JSON text parsing shared by the readers and the normaliser.

Python's ``json`` is laxer than the JSON the rest of the farm reads: it accepts
NaN and Infinity, and it turns an escaped half surrogate pair ("\\ud800") into a
str that cannot be encoded as UTF-8, so the row would fail later, when a shard
is written or the tokenizer runs. :func:`loads` refuses both, up front.
"""

from __future__ import annotations

import json
from typing import Any

from ledger.errors import InputRowError, RegenError


class LoneSurrogate(RegenError, ValueError):
    """The JSON text escapes half of a surrogate pair, which is not a character."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
# Bound once: the decoder is stateless, and json.loads with any keyword argument
# would build a new decoder per call.
_decode = _DECODER.decode


def has_lone_surrogate(obj: Any) -> bool:
    """Whether any string in ``obj`` holds a lone surrogate (cannot be encoded as UTF-8)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def loads(text: str) -> Any:
    """Parse JSON text strictly.

    Raises:
        json.JSONDecodeError: the text is not JSON (``msg`` and ``colno`` say where).
        LoneSurrogate: the text escapes a lone surrogate.
        ValueError: NaN, Infinity, or nesting deeper than Python's recursion limit.
    """
    try:
        obj = _decode(text)
    except RecursionError as e:
        raise ValueError("JSON is nested too deeply") from e
    # The substring test is a fast C scan; the full check runs only on the rare
    # text that escapes a surrogate at all (emoji written as \ud83d\ude00 do).
    if ("\\ud" in text or "\\uD" in text) and has_lone_surrogate(obj):
        raise LoneSurrogate("JSON escapes a lone surrogate (\\ud800-\\udfff)")
    return obj


def raw_decode(text: str, pos: int) -> tuple[Any, int]:
    """:func:`loads` of the one JSON value that starts at ``text[pos]``: the value and where it ends.

    Raises:
        as :func:`loads`.
    """
    try:
        obj, end = _DECODER.raw_decode(text, pos)
    except RecursionError as e:
        raise ValueError("JSON is nested too deeply") from e
    if (text.find("\\ud", pos, end) >= 0 or text.find("\\uD", pos, end) >= 0) and has_lone_surrogate(obj):
        raise LoneSurrogate("JSON escapes a lone surrogate (\\ud800-\\udfff)")
    return obj, end


def parse_field(text: str, reason: str, where: str) -> Any:
    """:func:`loads` for a JSON string held in a field (tools, tool call arguments).

    Raises:
        InputRowError: with ``reason``, naming the field ``where``.
    """
    try:
        return loads(text)
    except ValueError as e:
        raise InputRowError(reason, f"{where} is not valid JSON: {str(e)[:120]}") from e


def describe(value: Any) -> str:
    """A value's type in words for error details: "an integer", "a list", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"
