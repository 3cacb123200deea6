"""ShareGPT turns (``{"from", "value"}``) to OpenAI-style messages, one message per turn.

The output still holds raw values (a ``value`` of the wrong type, arguments as a
JSON string): :func:`producer.dataset.normalize.normalize_messages` checks and normalises
them next, naming ``conversations[i]`` in its details. Keeping one message per
turn is what lets those details point at the right turn.

``function_call`` turns are LLaMA-Factory's: the value is a JSON object
``{"name", "arguments"}`` or a list of them (parallel calls). They become an
assistant message with ``tool_calls`` and empty content; ``observation`` turns
become ``tool`` messages. ShareGPT has no call ids, so none are made up: the
same conversation in OpenAI form without ids then gets the same content hash.
"""

from __future__ import annotations

from typing import Any

from ledger.errors import InputRowError

from . import jsontext, reasons
from .jsontext import describe

#: ShareGPT speaker names and the role each one becomes. Besides the canonical
#: names, the ones seen in popular ShareGPT-style datasets (OpenHermes' "gpt",
#: LLaMA-Factory's "observation", datasets that write OpenAI roles in "from").
FROM_ROLES: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "observation": "tool",
    "tool": "tool",
}

#: The speaker whose value is a JSON tool call rather than text.
FUNCTION_CALL = "function_call"


def sharegpt_to_messages(turns: Any) -> list[Any]:
    """One OpenAI-style message per ShareGPT turn, values not yet checked.

    A turn that already has ``role`` and no ``from`` (some datasets name their
    OpenAI-form column ``conversations``) passes through unchanged.

    Raises:
        InputRowError: ``wrong_type``, ``missing_field``, ``unknown_role`` or
            ``invalid_tool_arguments``, naming the turn.
    """
    if not isinstance(turns, list):
        raise InputRowError(reasons.WRONG_TYPE, f"conversations is {describe(turns)}, expected a list")
    out: list[Any] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            # Left for normalize_messages, which reports it with the same wording as for messages.
            out.append(turn)
            continue
        speaker = turn.get("from")
        if speaker is None:
            if turn.get("role") is not None:
                out.append(turn)
                continue
            raise InputRowError(reasons.MISSING_FIELD, f"conversations[{i}].from is missing")
        if not isinstance(speaker, str):
            raise InputRowError(reasons.WRONG_TYPE,
                                f"conversations[{i}].from is {describe(speaker)}, expected a string")
        value = turn.get("value")
        if speaker == FUNCTION_CALL:
            out.append({"role": "assistant", "content": "", "tool_calls": _calls_from_value(value, i)})
            continue
        role = FROM_ROLES.get(speaker)
        if role is None:
            raise InputRowError(reasons.UNKNOWN_ROLE,
                                f"conversations[{i}].from is {speaker[:40]!r}; known: "
                                f"{', '.join(sorted([*FROM_ROLES, FUNCTION_CALL]))}")
        if value is None and role != "assistant":
            raise InputRowError(reasons.MISSING_FIELD, f"conversations[{i}].value is missing or null")
        if value is not None and not isinstance(value, str):
            raise InputRowError(reasons.WRONG_TYPE,
                                f"conversations[{i}].value is {describe(value)}, expected a string")
        out.append({"role": role, "content": value})
    return out


def _calls_from_value(value: Any, i: int) -> list[Any]:
    where = f"conversations[{i}].value"
    if isinstance(value, str):
        value = jsontext.parse_field(value, reasons.INVALID_TOOL_ARGUMENTS, f"{where} of a function_call")
    calls = value if isinstance(value, list) else [value]
    if not calls:
        raise InputRowError(reasons.INVALID_TOOL_ARGUMENTS, f"{where} of a function_call is an empty list")
    out = []
    for k, call in enumerate(calls):
        if not isinstance(call, dict):
            raise InputRowError(reasons.INVALID_TOOL_ARGUMENTS,
                                f"{where}[{k}] of a function_call is {describe(call)}, expected "
                                '{"name": ..., "arguments": ...}')
        # The OpenAI-form normaliser checks the name and parses the arguments.
        out.append({"type": "function",
                    "function": {"name": call.get("name"), "arguments": call.get("arguments")}})
    return out
