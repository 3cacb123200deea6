"""The source's cached tool results, paired with the calls the model itself made.

Tools are never executed (worker/conversation/dialogue.py): when the model calls what the
source called, the source's results are put after the model's calls, re-labelled with the
model's ids; when it calls something else, the conversation stops there. Calls match by name
as a multiset (parallel calls may come in another order), then one by one: each model call takes
the source call of its name with the same arguments if there is one, else the first free one of its
name, and a result spliced after a call whose arguments differ from its source call's is reported
(``tool_args_differ``): it answers arguments the model did not ask about.

A target that makes one call per action (gpt-oss: Harmony ends an action at ``<|call|>``, and
vLLM stops generating there) makes the calls of a source turn one generation at a time, each
seeing the results of the ones before; :func:`splice_some` pairs such a part of the turn's calls
and keeps the rest for the next generation.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def call_name(call: dict[str, Any]) -> str:
    function = call.get("function") or call
    return str(function.get("name", ""))


def call_arguments(call: dict[str, Any]) -> Any:
    """A call's arguments as an object (a source row may carry them as JSON text)."""
    arguments = (call.get("function") or call).get("arguments")
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return {} if arguments is None else arguments


def same_arguments(got: Any, expected: Any) -> bool:
    """Whether two calls ask the same: equal objects, where a value written as text equals the same value typed
    (a parser reads ``<parameter=n>3`` as 3 when the schema says integer; the source may have "3")."""
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(same_arguments(got[k], expected[k]) for k in got)
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(same_arguments(a, b) for a, b in zip(got, expected, strict=True))
    if isinstance(got, str) != isinstance(expected, str):
        text, value = (got, expected) if isinstance(got, str) else (expected, got)
        return text.strip() in (json.dumps(value, ensure_ascii=False), str(value))
    return got == expected


def differ_reason(differ: list[dict[str, Any]]) -> str:
    """The stop reason of a conversation ended at a call with other arguments (``--on-tool-mismatch stop``)."""
    first = differ[0]
    return (f"tool_args_differ: {first['name']} {json.dumps(first['arguments'], ensure_ascii=False)[:200]} "
            f"!= source {json.dumps(first['source_arguments'], ensure_ascii=False)[:200]}")


def differ_record(call: dict[str, Any], source_call: dict[str, Any]) -> dict[str, Any]:
    """What a row says of a call whose spliced result answers other arguments."""
    return {"name": call_name(call), "arguments": call_arguments(call),
            "source_arguments": call_arguments(source_call)}


def splice_all(
    calls: list[dict[str, Any]],
    source_calls: list[dict[str, Any]],
    source_results: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], str | None, list[dict[str, Any]]]:
    """The tool messages to append after ``calls`` (all of the source turn's calls), a stop reason, and the calls
    whose arguments differ from those of the source call whose result follows them (``differ_record``).

    The results are re-ordered to follow the model's calls and re-labelled with its ids,
    because Qwen templates pair a result with a call by position. A result carries a
    ``name`` only where the source's has one, as an OpenAI request carries it: Kimi's
    template writes a message's ``name`` in place of its role.

    Returns:
        The tool messages to append, None and the differing calls, or ``[]``, the reason the conversation
        stops and ``[]``.
    """
    got = [call["function"]["name"] for call in calls]
    expected = [call_name(call) for call in source_calls]
    if sorted(got) != sorted(expected):
        return [], _diverged(expected, got), []
    spliced, _, _, stop, differ = splice_some(calls, source_calls, source_results)
    return spliced, stop, differ


def splice_some(
    calls: list[dict[str, Any]],
    source_calls: list[dict[str, Any]],
    source_results: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], str | None, list[dict[str, Any]]]:
    """Results for ``calls``, a part of the source turn's calls (one action's); and the calls and results left.

    Returns:
        (tool messages to append, source calls not yet made, their results, None, the calls whose arguments
        differ from their source call's), or ``([], [], [], reason, [])`` when the calls are not among the
        source's or its results do not pair up.
    """
    got = [call["function"]["name"] for call in calls]
    expected = [call_name(call) for call in source_calls]
    if Counter(got) - Counter(expected):
        return [], [], [], _diverged(expected, got), []

    owners: list[dict[str, Any] | None] = [None] * len(source_calls)  # the result of each source call
    for n, result in enumerate(source_results):
        k = _owner_of(result, source_calls, expected, owners)
        if k is None:
            label = result.get("name") or result.get("tool_call_id") or f"#{n}"
            return [], [], [], f"tool_results_unmatched: result {label} answers no call", []
        owners[k] = result
    missing = [expected[k] for k, owner in enumerate(owners) if owner is None]
    if missing:
        return [], [], [], f"tool_results_missing: no result for [{','.join(missing)}]", []

    used = [False] * len(source_calls)
    pairs = _pair_calls(calls, got, source_calls, expected, used)
    spliced: list[dict[str, Any]] = []
    differ: list[dict[str, Any]] = []
    for call, name, k in zip(calls, got, pairs, strict=True):
        if not same_arguments(call_arguments(call), call_arguments(source_calls[k])):
            differ.append(differ_record(call, source_calls[k]))
        result = {**owners[k], "tool_call_id": call["id"]}
        if result.get("name"):
            result["name"] = name
        spliced.append(result)
    left = [k for k in range(len(source_calls)) if not used[k]]
    return spliced, [source_calls[k] for k in left], [owners[k] for k in left], None, differ  # type: ignore[misc]


def _pair_calls(calls: list[dict[str, Any]], got: list[str], source_calls: list[dict[str, Any]],
                expected: list[str], used: list[bool]) -> list[int]:
    """The source call each model call takes: first every call whose name and arguments match one (parallel
    calls in another order pair up right), then the rest by name, in order. Marks the taken ones in ``used``."""
    pairs: list[int | None] = [None] * len(calls)
    for n, (call, name) in enumerate(zip(calls, got, strict=True)):
        k = next((k for k, other in enumerate(expected) if other == name and not used[k]
                  and same_arguments(call_arguments(call), call_arguments(source_calls[k]))), None)
        if k is not None:
            used[k], pairs[n] = True, k
    for n, name in enumerate(got):
        if pairs[n] is None:
            k = next(k for k, other in enumerate(expected) if other == name and not used[k])
            used[k], pairs[n] = True, k
    return pairs  # type: ignore[return-value]


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
