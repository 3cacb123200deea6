"""Stream the elements of a file that is one JSON array (ShareGPT's form), never the whole array.

ShareGPT-style sets are published as one array of conversations
(``ShareGPT_V3_unfiltered_cleaned_split.json``: 94K conversations, 670 MB). ``json.load``
would hold all of it, three to ten times over as Python objects. This reads the text in
chunks and decodes one element at a time with the standard library's C decoder
(``raw_decode``), so memory holds one chunk and one element: docs/formats.md has the peak
RSS measured on a 100,000-conversation array. ijson would do the same but is not a
dependency of the control plane.

An element that is not an object is a ``not_an_object`` row and the next one is read. A
syntax error, invalid UTF-8 or an element over the size limit ends the file there (one
error row): unlike JSON lines, nothing marks where the next element starts.
Rows are 0-based element indexes (what ``json.load(f)[i]`` shows).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

from ledger.errors import InputRowError

from . import jsontext, reasons

#: Characters read per chunk: one system call per megabyte, a small part of the memory bound.
CHUNK_CHARS = 1 << 20

_WHITESPACE = " \t\n\r"

#: A value cut by a chunk's end fails to decode within a few characters of that end
#: ("tru", "1.", "\\u12"), or at the start of an unterminated string: an error further
#: back is the text's own.
_CUT_MARGIN_CHARS = 8


class _Text:
    """A window on the decoded text: ``buf[pos:]`` is what is read and not yet parsed."""

    def __init__(self, stream: io.TextIOBase):
        self.stream, self.buf, self.pos, self.eof = stream, "", 0, False

    def more(self, chars: int) -> bool:
        """Read at least ``chars`` more characters (fewer at the end); False at the end of the file."""
        if self.eof:
            return False
        if self.pos:
            self.buf, self.pos = self.buf[self.pos:], 0  # drop what was parsed before growing
        chunk = self.stream.read(chars)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def next_char(self) -> str:
        """The next character that is not whitespace ('' at the end), left unconsumed."""
        while True:
            buf, pos = self.buf, self.pos
            while pos < len(buf) and buf[pos] in _WHITESPACE:
                pos += 1
            self.pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self.more(CHUNK_CHARS):
                return ""


def _decode_value(text: _Text, max_chars: int) -> Any:
    """The next JSON value; reads more text while the value runs past what is read.

    Raises:
        ValueError: a syntax error (json.JSONDecodeError), NaN, a lone surrogate, or an
            element longer than ``max_chars`` (_TooLarge).
    """
    while True:
        try:
            obj, end = jsontext.raw_decode(text.buf, text.pos)
        except json.JSONDecodeError as e:
            if e.pos < len(text.buf) - _CUT_MARGIN_CHARS and not e.msg.startswith("Unterminated string"):
                raise  # wrong well before the end of what is read: more text cannot mend it
            if len(text.buf) - text.pos > max_chars:
                raise _TooLarge from None
            # Incomplete or wrong: more text tells which. Reading as much again as is held
            # keeps the re-parsing of one large element linear, not quadratic.
            if text.more(max(CHUNK_CHARS, len(text.buf) - text.pos)):
                continue
            raise
        # A number or literal cut by the chunk's end decodes as a shorter one: only a
        # value followed by something (or the end of the file) is whole.
        if end < len(text.buf) or text.eof or not text.more(CHUNK_CHARS):
            text.pos = end
            return obj


class _TooLarge(ValueError):
    pass


def iter_array(stream: io.TextIOBase, *, max_chars: int) -> Iterator[tuple[int, Any, InputRowError | None]]:
    """``(index, element, error)`` for each element of the array that ``stream`` holds.

    ``error`` is None for an object; otherwise ``element`` is None and, unless the reason
    is ``not_an_object``, it is the last item: the rest of the file cannot be read.
    Decoding errors of the stream itself (UnicodeDecodeError, a corrupt compressed stream)
    propagate: the caller names them.
    """
    text = _Text(stream)
    if text.next_char() != "[":
        raise AssertionError("iter_array is called on a stream that starts with '['")
    text.pos += 1
    index = 0
    if text.next_char() == "]":
        text.pos += 1
        yield from _after_array(text, index)
        return
    while True:
        text.next_char()  # raw_decode takes no leading whitespace
        try:
            obj = _decode_value(text, max_chars)
        except _TooLarge:
            yield index, None, InputRowError(
                reasons.TOO_LARGE, f"element is longer than {max_chars} characters; the rest of the file is not read")
            return
        except jsontext.LoneSurrogate as e:
            yield index, None, InputRowError(reasons.INVALID_UTF8, f"{e}; the rest of the file is not read")
            return
        except ValueError as e:
            yield index, None, _unreadable(text, e)
            return
        if type(obj) is dict:
            yield index, obj, None
        else:
            yield index, None, InputRowError(
                reasons.NOT_AN_OBJECT, f"element holds {jsontext.describe(obj)}, expected an object")
        index += 1
        sep = text.next_char()
        text.pos += 1
        if sep == "]":
            yield from _after_array(text, index)
            return
        if sep != ",":
            found = f"{sep!r}" if sep else "the end of the file"
            yield index, None, InputRowError(
                reasons.UNREADABLE_FILE,
                f"after element {index - 1}: expected ',' or ']', found {found} (truncated or not one JSON array)")
            return


def _after_array(text: _Text, count: int) -> Iterator[tuple[int, Any, InputRowError | None]]:
    if text.next_char():
        yield count, None, InputRowError(
            reasons.UNREADABLE_FILE, "text after the array's closing ']' (several arrays or objects in one file?)")


def _unreadable(text: _Text, e: ValueError) -> InputRowError:
    if isinstance(e, json.JSONDecodeError):
        near = e.doc[max(0, e.pos - 20):e.pos + 20].replace("\n", " ")
        detail = f"not valid JSON ({e.msg}) near {near!r}"
    else:
        detail = str(e)[:200]
    return InputRowError(reasons.UNREADABLE_FILE, f"{detail}; the rest of the file is not read")
