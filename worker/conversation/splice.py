"""The source's cached tool results, paired with the calls the model itself made.

Tools are never executed (worker/conversation/dialogue.py): when the model calls what the
source called, the source's results are put after the model's calls, re-labelled with the
model's ids; when it calls something else, the conversation stops there. Calls match by name
as a multiset (parallel calls may come in another order).

A target that makes one call per action (gpt-oss: Harmony ends an action at ``<|call|>``, and
vLLM stops generating there) makes the calls of a source turn one generation at a time, each
seeing the results of the ones before; :func:`splice_some` pairs such a part of the turn's calls
and keeps the rest for the next generation.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def call_name(call: dict[str, Any]) -> str:
    function = call.get("function") or call
    return str(function.get("name", ""))


def splice_all(
    calls: list[dict[str, Any]],
    source_calls: list[dict[str, Any]],
    source_results: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], str | None]:
    """The tool messages to append after ``calls`` (all of the source turn's calls), and a stop reason.

    The results are re-ordered to follow the model's calls and re-labelled with its ids,
    because Qwen templates pair a result with a call by position. A result carries a
    ``name`` only where the source's has one, as an OpenAI request carries it: Kimi's
    template writes a message's ``name`` in place of its role.

    Returns:
        The tool messages to append and None, or ``[]`` and the reason the conversation stops.
    """
    got = [call["function"]["name"] for call in calls]
    expected = [call_name(call) for call in source_calls]
    if sorted(got) != sorted(expected):
        return [], _diverged(expected, got)
    spliced, _, _, stop = splice_some(calls, source_calls, source_results)
    return spliced, stop


def splice_some(
    calls: list[dict[str, Any]],
    source_calls: list[dict[str, Any]],
    source_results: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """Results for ``calls``, a part of the source turn's calls (one action's); and the calls and results left.

    Returns:
        (tool messages to append, source calls not yet made, their results, None), or
        ``([], [], [], reason)`` when the calls are not among the source's or its results do not pair up.
    """
    got = [call["function"]["name"] for call in calls]
    expected = [call_name(call) for call in source_calls]
    if Counter(got) - Counter(expected):
        return [], [], [], _diverged(expected, got)

    owners: list[dict[str, Any] | None] = [None] * len(source_calls)  # the result of each source call
    for n, result in enumerate(source_results):
        k = _owner_of(result, source_calls, expected, owners)
        if k is None:
            label = result.get("name") or result.get("tool_call_id") or f"#{n}"
            return [], [], [], f"tool_results_unmatched: result {label} answers no call"
        owners[k] = result
    missing = [expected[k] for k, owner in enumerate(owners) if owner is None]
    if missing:
        return [], [], [], f"tool_results_missing: no result for [{','.join(missing)}]"

    spliced: list[dict[str, Any]] = []
    used = [False] * len(source_calls)
    for call, name in zip(calls, got, strict=True):
        k = next(k for k, other in enumerate(expected) if other == name and not used[k])
        used[k] = True
        result = {**owners[k], "tool_call_id": call["id"]}
        if result.get("name"):
            result["name"] = name
        spliced.append(result)
    left = [k for k in range(len(source_calls)) if not used[k]]
    return spliced, [source_calls[k] for k in left], [owners[k] for k in left], None  # type: ignore[misc]


def _diverged(expected: list[str], got: list[str]) -> str:
    return f"tool_calls_diverged: expected [{','.join(expected)}] got [{','.join(got)}]"


def _owner_of(
    result: dict[str, Any],
    source_calls: list[dict[str, Any]],
    names: list[str],
    owners: list[dict[str, Any] | None],
) -> int | None:
    """Index of the source call a result answers: by id, else by name, else by position."""
    free = [k for k, owner in enumerate(owners) if owner is None]
    call_id = result.get("tool_call_id")
    if call_id:
        for k in free:
            if source_calls[k].get("id") == call_id:
                return k
    name = result.get("name")
    if name:
        return next((k for k in free if names[k] == name), None)
    return free[0] if free else None
