"""Where vLLM keeps its parser classes and its chat request model, across the versions regen supports.

vLLM moved these between releases (tool parsers from ``vllm.entrypoints.openai.tool_parsers``
to ``vllm.tool_parsers``; the request model from ``vllm.entrypoints.openai.protocol`` to
``chat_completion.protocol``). Each lookup tries the newer home first; an ImportError
means this vLLM has no parser machinery at all, a KeyError that it lacks that name.
"""

from __future__ import annotations

import importlib
from typing import Any


def _first_module(*names: str) -> Any:
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise ImportError("; ".join(errors))


def chat_request_class() -> type:
    module = _first_module("vllm.entrypoints.openai.chat_completion.protocol", "vllm.entrypoints.openai.protocol")
    return module.ChatCompletionRequest


def reasoning_parser_class(name: str) -> type:
    manager = _first_module("vllm.reasoning").ReasoningParserManager
    return _lookup(manager, name, "get_reasoning_parser")


def tool_parser_class(name: str) -> type:
    manager = _first_module("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers").ToolParserManager
    return _lookup(manager, name, "get_tool_parser")


def _lookup(manager: Any, name: str, getter: str) -> type:
    try:
        return getattr(manager, getter)(name)
    except KeyError:
        raise
    except Exception as e:  # noqa: BLE001 - vLLM raises KeyError or ValueError by version
        raise KeyError(f"{name!r} ({type(e).__name__}: {e})") from e


def harmony_utils() -> Any:
    """vLLM's Harmony helpers (gpt-oss): ``vllm.entrypoints.openai.parser`` since 0.12, ``vllm.entrypoints`` before."""
    return _first_module("vllm.entrypoints.openai.parser.harmony_utils", "vllm.entrypoints.harmony_utils")


def chat_tool_class() -> type:
    """The request model of one tool of a chat request (``ChatCompletionToolsParam``)."""
    module = _first_module("vllm.entrypoints.openai.chat_completion.protocol", "vllm.entrypoints.openai.protocol")
    return module.ChatCompletionToolsParam
