"""Tool-call ids in the form a target's chat template demands.

Most templates render any id or none. Mistral's refuse every id that is not 9
alphanumerics ("Tool call IDs should be alphanumeric strings with length 9!"; the
Mistral Small 3.1 template takes at least 9 and keeps the last 9), and vLLM's
``mistral`` parser draws such ids at random, so regen chooses them itself, always
the same for the same call:

* the id the model wrote in its call, where the format lets it write one and it is valid
  (targets/turn_parsers.py: an id the model wrote is part of its text);
* else the source's own id for that call, where it is valid (the dataset's ids survive);
* else one derived from the sample, the turn and the call: 9 base-62 digits of a SHA-256,
  so a retry, another worker or another run renders the same prompt.
"""

from __future__ import annotations

import hashlib
import re

#: The id rule of each tool parser whose template constrains ids (a parser not listed takes any id).
ID_RULES = {"mistral": "alnum9"}
_ALNUM9 = re.compile(r"[A-Za-z0-9]{9}")
_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def id_rule(tool_parser: str | None) -> str | None:
    """The id rule the tool parser's family imposes ("alnum9"), or None."""
    return ID_RULES.get(tool_parser or "")


def is_valid(call_id: object, rule: str | None) -> bool:
    if rule is None:
        return isinstance(call_id, str) and bool(call_id)
    return isinstance(call_id, str) and _ALNUM9.fullmatch(call_id) is not None


def derived_id(sample_key: str, turn: int, index: int) -> str:
    """9 alphanumerics, a pure function of (sample, turn, call index)."""
    number = int.from_bytes(hashlib.sha256(f"{sample_key}\x00{turn}\x00{index}".encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        number, digit = divmod(number, 62)
        out.append(_DIGITS[digit])
    return "".join(out)


def with_valid_ids(calls: list[dict], rule: str | None, *, sample_key: str, turn: int,
                   source_calls: list[dict]) -> list[dict]:
    """``calls`` with every id the rule refuses replaced: by the source's id for the call (same name, in order,
    valid and not yet used), else by :func:`derived_id`. Unchanged when there is no rule."""
    if rule is None:
        return calls
    used = {call.get("id") for call in calls if is_valid(call.get("id"), rule)}
    free = [c for c in source_calls if is_valid(c.get("id"), rule) and c.get("id") not in used]
    out = []
    for index, call in enumerate(calls):
        if is_valid(call.get("id"), rule):
            out.append(call)
            continue
        name = (call.get("function") or {}).get("name")
        own = next((c for c in free if (c.get("function") or {}).get("name") == name), None)
        if own is not None:
            free.remove(own)
            new_id = own["id"]
        else:
            new_id = derived_id(sample_key, turn, index)
        used.add(new_id)
        out.append({**call, "id": new_id})
    return out
