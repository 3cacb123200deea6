"""Turn one input row (OpenAI or ShareGPT form) into the normalised sample of docs/CONTRACTS.md.

Accepted input:

* OpenAI form: ``messages`` of ``{role, content, tool_calls?, reasoning_content?,
  name?, tool_call_id?}``; roles system, developer (taken as system), user,
  assistant, tool. ``content`` is a string, a list of text parts (joined with
  "\\n", as vLLM joins them), or null on an assistant turn (becomes "").
* ShareGPT form: ``conversations`` of ``{from, value}`` (see producer.dataset.sharegpt).
  When a row has both, ``messages`` wins.
* Either form: ``tools`` (a list of function specs, or a JSON string of one; bare
  ``{name, description, parameters}`` specs are wrapped as ``{"type": "function",
  "function": ...}``), ``id`` (str or int), and a top-level ``system`` string
  (LLaMA-Factory), which becomes the first message.

Choices a dataset owner may want to know:

* A system message that is not first is **kept where it is**: some datasets use
  them mid-conversation and templates such as Qwen3's render them. The worker's
  chat template is the authority; if it refuses, that sample fails there.
* Optional keys that are null, empty strings or empty lists are dropped, so a
  Parquet row (where every struct field exists, null when unused) and the JSONL
  row it came from normalise to the same thing. For the same reason ``tools``
  that is null, "", "[]" or [] becomes null, and an empty-string ``id`` counts as
  no id. Message keys regen does not know (``weight``, ``loss``) are dropped;
  keys of a tool's function spec are kept (templates render the spec whole).
* ``reasoning_content`` is kept on assistant turns (the worker regenerates them
  anyway) and dropped elsewhere. Tool call ``id`` s are kept, since tool results
  refer to them; the contract's other keys are as documented there.
* Null values inside tool ``parameters`` are dropped: Parquet stores a union of
  every row's schema properties and fills the missing ones with null, which the
  model would otherwise see as phantom properties.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from ledger.errors import InputRowError

from . import jsontext, reasons
from .jsontext import describe
from .sharegpt import sharegpt_to_messages

#: Top-level fields normalize_row reads; the Parquet reader decodes only these columns.
INPUT_FIELDS = ("id", "messages", "conversations", "tools", "system")

#: Most turns in one conversation. Longer rows are loops or scraped logs, never
#: chats that fit a context window, and each turn costs the worker a render pass.
MAX_MESSAGES = 1000

#: Most characters of text (contents, reasoning, string tool arguments) in one
#: conversation: about 500K tokens, beyond any target model's context, so such a
#: row could only fail later after costing memory in a shard and a worker.
MAX_CHARS = 2_000_000

#: Longest row id kept, in characters. Ids go into Postgres indexes and logs; a
#: longer "id" is almost always a mis-mapped text column.
MAX_ID_CHARS = 256

#: Message roles accepted in OpenAI form, and the role each one becomes. OpenAI's
#: "developer" is its newer name for the system prompt.
ROLES: dict[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}

_NAME_CHARS = 40

# Built once: json.dumps with keyword arguments builds a new encoder per call.
_canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def normalize_row(obj: dict[str, Any]) -> dict[str, Any]:
    """The normalised sample ``{"sample_id", "messages", "tools"}`` of one row (the caller adds ``source``).

    Raises:
        InputRowError: the row cannot become a sample; ``reason`` is one of
            :data:`producer.dataset.reasons.REASONS`, ``detail`` names the field and turn.
    """
    if not isinstance(obj, dict):
        raise InputRowError(reasons.NOT_AN_OBJECT, f"row is {describe(obj)}, expected an object")
    sample_id = _row_id(obj.get("id"))
    raw = obj.get("messages")
    field = "messages"
    if raw is None:
        conversations = obj.get("conversations")
        if conversations is None:
            raise InputRowError(reasons.MISSING_FIELD, "row has neither 'messages' nor 'conversations'")
        field = "conversations"
        raw = sharegpt_to_messages(conversations)
    messages = normalize_messages(raw, field)
    system = obj.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise InputRowError(reasons.WRONG_TYPE, f"system is {describe(system)}, expected a string")
        if system:
            messages.insert(0, {"role": "system", "content": system})
    tools = normalize_tools(obj.get("tools"))
    if sample_id is None:
        sample_id = content_hash_id(messages, tools)
    return {"sample_id": sample_id, "messages": messages, "tools": tools}


def content_hash_id(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The id of a row that has none: a hash of its normalised content.

    The same conversation gets the same id whatever its input form, file or
    position, so re-running a submit finds the samples it already has.
    """
    canonical = _canonical_json({"messages": messages, "tools": tools})
    return "h" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def _row_id(value: Any) -> str | None:
    if value is None:
        return None
    if type(value) is str:
        if len(value) > MAX_ID_CHARS:
            raise InputRowError(reasons.ID_TOO_LONG, f"id has {len(value)} characters, limit {MAX_ID_CHARS}")
        if "\x00" in value:
            # Postgres text cannot hold NUL: the id would fail the submit's COPY, and with it the whole group.
            raise InputRowError(reasons.INVALID_ID, f"id {value[:_NAME_CHARS]!r} holds a NUL character")
        return value or None
    # bool is an int subclass; True as an id is a mapping mistake, not an id.
    if type(value) is int:
        return str(value)
    raise InputRowError(reasons.WRONG_TYPE, f"id is {describe(value)}, expected a string or integer")


def normalize_messages(raw: Any, field: str = "messages") -> list[dict[str, Any]]:
    """Check and normalise OpenAI-style messages; ``field`` names them in error details.

    Raises:
        InputRowError: see :func:`normalize_row`.
    """
    if not isinstance(raw, list):
        raise InputRowError(reasons.WRONG_TYPE, f"{field} is {describe(raw)}, expected a list")
    if not raw:
        raise InputRowError(reasons.EMPTY_CONVERSATION, f"{field} is an empty list")
    if len(raw) > MAX_MESSAGES:
        raise InputRowError(reasons.TOO_LARGE, f"{field} has {len(raw)} turns, limit {MAX_MESSAGES}")
    out: list[dict[str, Any]] = []
    chars = 0
    has_user = False
    # The last turn that is not a tool result: a tool result must follow an
    # assistant turn with tool calls, possibly after other tool results.
    last_non_tool: dict[str, Any] | None = None
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InputRowError(reasons.WRONG_TYPE, f"{field}[{i}] is {describe(m)}, expected an object")
        role = _role(m.get("role"), field, i)
        content = _content(m.get("content"), role, field, i)
        chars += len(content)
        msg: dict[str, Any] = {"role": role, "content": content}
        calls = m.get("tool_calls")
        if calls:
            if role != "assistant":
                raise InputRowError(reasons.WRONG_TYPE, f"{field}[{i}].tool_calls on a {role} turn; "
                                                        "only assistant turns call tools")
            msg["tool_calls"], args_chars = _tool_calls(calls, f"{field}[{i}]")
            chars += args_chars
        reasoning = m.get("reasoning_content")
        if reasoning and role == "assistant":
            msg["reasoning_content"] = _optional_str(reasoning, f"{field}[{i}].reasoning_content")
            chars += len(reasoning)
        for key in ("name", "tool_call_id"):
            value = m.get(key)
            if value:
                msg[key] = _optional_str(value, f"{field}[{i}].{key}")
        if role == "tool":
            if last_non_tool is None or "tool_calls" not in last_non_tool:
                raise InputRowError(reasons.TOOL_WITHOUT_CALL, f"{field}[{i}] is a tool result with no "
                                                               "assistant tool call before it")
        else:
            last_non_tool = msg
            has_user = has_user or role == "user"
        out.append(msg)
    if chars > MAX_CHARS:
        raise InputRowError(reasons.TOO_LARGE, f"{field} holds {chars} characters of text, limit {MAX_CHARS}")
    if not has_user:
        raise InputRowError(reasons.NO_USER_TURN, f"{field} has no user turn ({len(raw)} turns)")
    return out


def _role(value: Any, field: str, i: int) -> str:
    if value is None:
        raise InputRowError(reasons.MISSING_FIELD, f"{field}[{i}].role is missing")
    role = ROLES.get(value) if isinstance(value, str) else None
    if role is None:
        if not isinstance(value, str):
            raise InputRowError(reasons.WRONG_TYPE,
                                f"{field}[{i}].role is {describe(value)}, expected a string")
        raise InputRowError(reasons.UNKNOWN_ROLE, f"{field}[{i}].role is {value[:_NAME_CHARS]!r}; "
                                                  f"known: {', '.join(ROLES)}")
    return role


def _content(value: Any, role: str, field: str, i: int) -> str:
    if type(value) is str:
        return value
    where = f"{field}[{i}].content"
    if value is None:
        # An assistant turn that only calls tools has null content in OpenAI's API.
        if role == "assistant":
            return ""
        raise InputRowError(reasons.MISSING_FIELD, f"{where} is missing or null on a {role} turn")
    if isinstance(value, list):
        texts = []
        for k, part in enumerate(value):
            if not isinstance(part, dict):
                raise InputRowError(reasons.WRONG_TYPE,
                                    f"{where}[{k}] is {describe(part)}, expected a content part object")
            kind = part.get("type")
            text = part.get("text")
            if kind not in (None, "text"):
                raise InputRowError(reasons.UNSUPPORTED_CONTENT,
                                    f"{where}[{k}] is a {str(kind)[:_NAME_CHARS]!r} part; only text is supported")
            if not isinstance(text, str):
                raise InputRowError(reasons.WRONG_TYPE, f"{where}[{k}].text is {describe(text)}, "
                                                        "expected a string")
            texts.append(text)
        # vLLM joins text parts with a newline when it renders string content.
        return "\n".join(texts)
    raise InputRowError(reasons.WRONG_TYPE,
                        f"{where} is {describe(value)}, expected a string or a list of text parts")


def _optional_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InputRowError(reasons.WRONG_TYPE, f"{where} is {describe(value)}, expected a string")
    return value


def _tool_calls(value: Any, where: str) -> tuple[list[dict[str, Any]], int]:
    """The normalised tool calls of one turn, and the characters of their string arguments."""
    if not isinstance(value, list):
        raise InputRowError(reasons.WRONG_TYPE, f"{where}.tool_calls is {describe(value)}, expected a list")
    out = []
    chars = 0
    for j, call in enumerate(value):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict):
            raise InputRowError(reasons.WRONG_TYPE, f"{at} is {describe(call)}, expected an object")
        kind = call.get("type")
        if kind not in (None, "function"):
            raise InputRowError(reasons.UNSUPPORTED_CONTENT,
                                f"{at}.type is {str(kind)[:_NAME_CHARS]!r}; only function calls are supported")
        # Some datasets flatten the call to {"name", "arguments"}.
        fn = call.get("function", call)
        if not isinstance(fn, dict):
            raise InputRowError(reasons.WRONG_TYPE, f"{at}.function is {describe(fn)}, expected an object")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise InputRowError(reasons.MISSING_FIELD if name in (None, "") else reasons.WRONG_TYPE,
                                f"{at}.function.name is missing or not a string")
        args = fn.get("arguments")
        if isinstance(args, str):
            chars += len(args)
        norm: dict[str, Any] = {"type": "function",
                                "function": {"name": name, "arguments": _arguments(args, at)}}
        call_id = call.get("id")
        if call_id:
            norm["id"] = _optional_str(call_id, f"{at}.id")
        out.append(norm)
    return out, chars


def _arguments(value: Any, at: str) -> dict[str, Any]:
    if type(value) is dict:
        # A Parquet struct comes as Python values, not parsed JSON: it may hold what JSON cannot.
        check_json_value(value, f"{at}.function.arguments", reasons.INVALID_TOOL_ARGUMENTS)
        return value
    if value is None:
        return {}
    if isinstance(value, str):
        if not value.strip():
            # Calls to functions without parameters often carry "" as arguments.
            return {}
        parsed = jsontext.parse_field(value, reasons.INVALID_TOOL_ARGUMENTS, f"{at}.function.arguments")
        if type(parsed) is dict:
            return parsed
        value = parsed
    raise InputRowError(reasons.INVALID_TOOL_ARGUMENTS,
                        f"{at}.function.arguments is {describe(value)}, expected a JSON object")


def normalize_tools(value: Any) -> list[dict[str, Any]] | None:
    """``tools`` as a list of ``{"type": "function", "function": {...}}``, or None when there are none.

    Raises:
        InputRowError: ``wrong_type``, ``invalid_tools`` or ``unsupported_content``.
    """
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        value = jsontext.parse_field(value, reasons.INVALID_TOOLS, "tools")
        if value is None:
            return None
    if not isinstance(value, list):
        raise InputRowError(reasons.WRONG_TYPE, f"tools is {describe(value)}, expected a list")
    return [_tool_spec(spec, k) for k, spec in enumerate(value)] or None


def _tool_spec(spec: Any, k: int) -> dict[str, Any]:
    at = f"tools[{k}]"
    if isinstance(spec, str):
        # A list<string> Parquet column: one JSON spec per element.
        spec = jsontext.parse_field(spec, reasons.INVALID_TOOLS, at)
    if not isinstance(spec, dict):
        raise InputRowError(reasons.INVALID_TOOLS, f"{at} is {describe(spec)}, expected an object")
    kind = spec.get("type")
    if kind not in (None, "function"):
        raise InputRowError(reasons.UNSUPPORTED_CONTENT,
                            f"{at}.type is {str(kind)[:_NAME_CHARS]!r}; only function tools are supported")
    fn = spec.get("function")
    if fn is None:
        fn = {key: v for key, v in spec.items() if key != "type"}
    if not isinstance(fn, dict):
        raise InputRowError(reasons.INVALID_TOOLS, f"{at}.function is {describe(fn)}, expected an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise InputRowError(reasons.INVALID_TOOLS, f"{at} has no function name")
    out = {key: v for key, v in fn.items() if v is not None}
    description = out.get("description")
    if description is not None and not isinstance(description, str):
        raise InputRowError(reasons.INVALID_TOOLS, f"{at}.function.description is "
                                                   f"{describe(description)}, expected a string")
    params = out.get("parameters")
    if isinstance(params, str):
        params = jsontext.parse_field(params, reasons.INVALID_TOOLS, f"{at}.function.parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise InputRowError(reasons.INVALID_TOOLS, f"{at}.function.parameters is "
                                                       f"{describe(params)}, expected a JSON schema object")
        out["parameters"] = _drop_nulls(params)
    check_json_value(out, f"{at}.function", reasons.INVALID_TOOLS)
    return {"type": "function", "function": out}


def check_json_value(value: Any, at: str, reason: str) -> None:
    """Refuse, as ``reason`` naming where, a value JSON cannot carry as it is: NaN or an infinity (the
    shard's encoder refuses them), a datetime, bytes or any other non-JSON type, or a non-string key.
    Parquet and Arrow give such values; raised outside InputRowError they aborted the whole submit.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputRowError(reason, f"{at} is {value!r}, which JSON cannot carry")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InputRowError(reason, f"{at} has a key {key!r} that is not a string")
            check_json_value(item, f"{at}.{key[:_NAME_CHARS]}", reason)
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json_value(item, f"{at}[{i}]", reason)
        return
    raise InputRowError(reason, f"{at} is a {type(value).__name__} value, which JSON cannot carry")


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value
