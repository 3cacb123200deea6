"""One generated turn to thought, answer and tool calls, with the parsers the run names.

vLLM's own parser classes do the reading (``vllm.reasoning``, ``vllm.tool_parsers``:
the code ``vllm serve`` runs for that target), so a turn is split the way the target
is served, for any family vLLM serves. regen keeps its own rules around them, the
same for every family:

* the prompt decides: one that already closed the thought (thinking off: ``</think>``
  last) leaves a completion that is all answer, whatever the reasoning parser's default;
  one that opened it (``<think>`` last) leaves a completion that is thought until its
  end marker (``thinking_after``);
* a thought cut off by max_tokens (no end marker) is all thought: nothing of it may
  become the answer, whatever the parser would make of it;
* a turn rendered without thinking is all answer;
* a malformed thought (a second one, a stray tag in the answer) is kept as generated and
  flagged (``think_tags_ok``), never tidied up: the next turn must see the model's own text;
* a call the parser cannot read is *recorded* (``errors``, with the raw text), never
  dropped: vLLM's parsers return such text as plain content;
* arguments are JSON objects (templates render dicts); a string that is not one is an
  error of that call;
* call ids come from the text when the format writes them (Kimi's ``functions.x:0``, an
  ``"id"`` in Mistral's JSON calls), else regen's deterministic ``call_<turn>_<n>`` (vLLM
  draws random ones), which dialogue.py replaces where the template demands another form
  (Mistral's 9 alphanumerics, targets/call_ids.py);
* a parser that raises is named in a ``ParserFailed``: that sample fails (``parser_error``),
  never the batch; a tool parser that raises on the call the model wrote records that
  call's error instead (the parser's name in it), as for a call it cannot read.

The text handed to vLLM's parsers is decoded from the engine's ids with special
tokens kept (as ``vllm serve`` does for tool parsers that read them), minus the
end-of-turn token. regen's own Qwen parser (targets/parsing.py) remains the fallback
for a vLLM whose parser modules cannot be imported at all, for the Qwen names only.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

from ledger.errors import RegenError
from targets.call_ids import id_rule, is_valid
from targets.parsing import ReasoningSplit, ToolCallParse, parse_tool_calls, split_reasoning
from targets.template_probe import prompt_thought

log = logging.getLogger(__name__)

#: Strip only the template's own newlines around a thought or an answer (spaces are the model's text).
_TEMPLATE_WS = "\n"
#: End-of-turn text left at the end of a decoded completion (Qwen's; the vLLM path drops the id instead).
_QWEN_END_OF_TURN = ("<|endoftext|>", "<|im_end|>")
#: The names regen's own Qwen parser implements (JSON and XML call bodies both).
_REGEN_REASONING = {None, "qwen3"}
_REGEN_TOOL = {None, "hermes", "qwen3_coder", "qwen3_xml", "qwen3_json"}
#: Reasoning parsers that start in the answer: a thought is only what the model opens with the start marker
#: (vLLM's ``mistral``: Magistral writes ``[THINK]`` itself, as its system prompt asks). A turn that does not
#: open with it is all answer, where regen's rule for a prompt that opened the thought would make it all thought.
_MODEL_OPENS_THOUGHT = {"mistral"}
#: Where a call starts, per tool parser whose class does not say it (``tool_call_start_token``).
_CALL_MARKERS = {"llama3_json": ("<|python_tag|>", "{"), "llama4_json": ("<|python_tag|>", "{"),
                 "mistral": ("[TOOL_CALLS]",), "kimi_k2": ("<|tool_calls_section_begin|>",),
                 # GLM's parser classes name no start token: without these a call they cannot read was an answer.
                 "glm45": ("<tool_call>",), "glm47": ("<tool_call>",),
                 "pythonic": ("[",), "llama4_pythonic": ("[",)}


class ParserUnavailable(RegenError):
    """The run names a parser this worker's vLLM does not have: every batch of the run would be misread."""


class ParserFailed(RegenError):
    """A parser raised on one turn's text: that sample's failure (``parser_error``), not the batch's."""


#: An id written inside a JSON call (Mistral's pre-v11 ``[TOOL_CALLS] [{..., "id": "..."}]``).
_WRITTEN_ID = re.compile(r'"id"\s*:\s*"([^"]*)"')


class TurnParser(Protocol):
    #: What ran, written on every output row: {"reasoning", "tool", "by"}.
    description: dict[str, Any]
    #: The id that ends a thought (to count reasoning tokens by id), when the family thinks.
    think_end_id: int | None

    def thinking_after(self, prompt_ids: list[int], thinking: bool) -> bool: ...

    def parse(self, generation: Any, *, thinking: bool, tools: list[dict] | None,
              turn: int) -> tuple[ReasoningSplit, ToolCallParse]: ...


#: Prompt ids decoded to see how it ends (a think tag and the template's newlines).
_PROMPT_TAIL_IDS = 6


def _thinking_after(tokenizer: Any, prompt_ids: list[int], thinking: bool) -> bool:
    """Whether the completion of this prompt starts inside a thought: as the prompt's end says, else ``thinking``."""
    if tokenizer is None or not prompt_ids:
        return thinking
    state = prompt_thought(tokenizer.decode(list(prompt_ids[-_PROMPT_TAIL_IDS:]), skip_special_tokens=False))
    return thinking if state is None else state == "opened"


class RegenQwenParser:
    """regen's own parser of Qwen3/Qwen3.5 output (targets/parsing.py), on the decoded text."""

    def __init__(self, tokenizer: Any = None, *, reasoning: str | None = "qwen3", tool: str | None = "hermes"):
        self.description = {"reasoning": reasoning, "tool": tool, "by": "regen"}
        self.tokenizer = tokenizer
        self.think_end_id = tokenizer.get_vocab().get("</think>") if tokenizer is not None else None

    def thinking_after(self, prompt_ids: list[int], thinking: bool) -> bool:
        return _thinking_after(self.tokenizer, prompt_ids, thinking)

    def parse(self, generation: Any, *, thinking: bool, tools: list[dict] | None,
              turn: int) -> tuple[ReasoningSplit, ToolCallParse]:
        text = generation.text
        if text is None:  # regen's engine leaves decoding to the parser (worker/conversation/generation.py)
            if self.tokenizer is None:
                raise ValueError("RegenQwenParser needs a tokenizer to read a generation without text")
            text = self.tokenizer.decode(list(generation.token_ids), skip_special_tokens=True)
        for marker in _QWEN_END_OF_TURN:
            text = text.removesuffix(marker)
        split = split_reasoning(text, thinking=thinking, finish_reason=generation.finish_reason)
        return split, parse_tool_calls(split.content, id_prefix=f"call_{turn}_")


@dataclass
class _Markers:
    think_start: str | None
    think_end: str | None
    calls: tuple[str, ...]


class VllmTurnParser:
    """vLLM's reasoning and tool parser classes, by their ``vllm serve`` names, with regen's rules around them."""

    def __init__(self, tokenizer: Any, *, reasoning: str | None, tool: str | None,
                 thinking_arg: str | None = None):
        import vllm

        from targets.vllm_compat import chat_request_class, tool_parser_class

        self.tokenizer = tokenizer
        self._request_class = chat_request_class()
        # The parser reads a thinking turn: told so the way the template is (deepseek_v3 reads
        # chat_template_kwargs' thinking / enable_thinking; without it, it reads no thought at all).
        # A turn without thinking never reaches it (_split).
        self._reasoning = _reasoning_parser(reasoning, tokenizer, thinking_arg) if reasoning else None
        self._tool = tool_parser_class(tool)(tokenizer) if tool else None
        self.description = {"reasoning": reasoning, "tool": tool, "by": f"vllm {vllm.__version__}"}
        #: The ids the template demands (targets/call_ids.py); dialogue.py replaces the ones that break it.
        self.call_id_rule = id_rule(tool)
        self._markers = _Markers(
            think_start=_first_str(self._reasoning, "reasoning_start_str", "start_token", "think_start_token"),
            think_end=_first_str(self._reasoning, "reasoning_end_str", "end_token", "think_end_token"),
            calls=_CALL_MARKERS.get(tool or "", ()) or tuple(
                m for m in (_first_str(self._tool, "tool_call_start_token", "tool_calls_start_token",
                                       "bot_token"),) if m),
        )
        vocab = tokenizer.get_vocab()
        self.think_end_id = vocab.get(self._markers.think_end) if self._markers.think_end else None
        ends = {tokenizer.eos_token_id} | set(getattr(tokenizer, "all_special_ids", ()) or ())
        #: Ids that can end a turn; one of them last in a stopped completion is not text.
        self._end_ids = {i for i in ends if i is not None}
        # vLLM's tool parsers log a traceback for every call they cannot read; regen records
        # those calls on the row instead, so a million-row run's log stays readable.
        logging.getLogger("vllm.tool_parsers").setLevel(logging.CRITICAL)
        logging.getLogger("vllm.entrypoints.openai.tool_parsers").setLevel(logging.CRITICAL)

    def thinking_after(self, prompt_ids: list[int], thinking: bool) -> bool:
        return _thinking_after(self.tokenizer, prompt_ids, thinking)

    def parse(self, generation: Any, *, thinking: bool, tools: list[dict] | None,
              turn: int) -> tuple[ReasoningSplit, ToolCallParse]:
        thinking = self.thinking_after(generation.prompt_token_ids, thinking)
        text = self._text(generation)
        request = self._request(tools)
        split = self._split(text, request, thinking=thinking, finish_reason=generation.finish_reason)
        return split, self._calls(split.content, request, turn=turn, finish_reason=generation.finish_reason)

    # -- steps --------------------------------------------------------------------------------
    def _text(self, generation: Any) -> str:
        ids = list(generation.token_ids)
        # Stopped by a stop token (stop_reason: its id) or by EOS (None): that id ends the turn and
        # is no text. A stop *string* (a str) leaves every id text.
        stop = generation.stop_reason
        if generation.finish_reason == "stop" and ids and (ids[-1] == stop or (stop is None and ids[-1] in self._end_ids)):
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _request(self, tools: list[dict] | None) -> Any:
        messages = [{"role": "user", "content": ""}]
        try:
            return self._request_class(model="regen", messages=messages, tools=tools or None)
        except Exception:  # noqa: BLE001 - a tool schema vLLM's request model refuses: parse without it
            return self._request_class(model="regen", messages=messages)

    def _split(self, text: str, request: Any, *, thinking: bool, finish_reason: str) -> ReasoningSplit:
        start, end = self._markers.think_start, self._markers.think_end
        opens_itself = self.description["reasoning"] in _MODEL_OPENS_THOUGHT and start is not None
        if self._reasoning is None or not thinking or (opens_itself and not text.lstrip().startswith(start)):
            content = text.strip(_TEMPLATE_WS)
            return ReasoningSplit(None, content, False, not _has(content, start, end))
        if end and end not in text:
            # No end of thought: all of it is thought. Cut off -> truncated; a model that
            # chose to stop inside its thought produced a malformed turn.
            thought = _drop_leading(text, start)
            return ReasoningSplit(thought.strip(_TEMPLATE_WS), "", finish_reason == "length",
                                  finish_reason != "stop" and not _has(thought, start, None))
        if end:
            head, _, tail = text.partition(end)
            thought = _drop_leading(head, start)
            if _has(thought, start, None) or _has(tail, start, end):
                # A second thought or a stray tag: vLLM's parsers tidy such text up, but the next
                # turn must see what the model wrote, so it is kept as generated and flagged.
                return ReasoningSplit(thought.strip(_TEMPLATE_WS), tail.strip(_TEMPLATE_WS), False, False)
        try:
            reasoning, content = _extract_reasoning(self._reasoning, text, request)
        except Exception as e:  # noqa: BLE001 - named here, recorded as this sample's parser_error
            raise ParserFailed(f"reasoning parser {self.description['reasoning']!r} raised "
                               f"{type(e).__name__}: {e}") from e
        reasoning = (reasoning or "").strip(_TEMPLATE_WS)
        content = (content or "").strip(_TEMPLATE_WS)
        return ReasoningSplit(reasoning, content, False, not _has(reasoning, start, None) and not _has(content, start, end))

    def _calls(self, content: str, request: Any, *, turn: int, finish_reason: str) -> ToolCallParse:
        if self._tool is None or not content:
            return ToolCallParse(content=content.strip())
        # A bare "{" or "[" (JSON and pythonic calls) counts only at the start: prose may hold brackets.
        attempted = any(content.lstrip().startswith(m) if m in ("{", "[") else m in content
                        for m in self._markers.calls)
        try:
            info = self._tool.extract_tool_calls(content, request)
        except Exception as e:  # noqa: BLE001 - this sample's, never the batch's: a call's error or parser_error
            crash = f"tool parser {self.description['tool']!r} raised {type(e).__name__}: {e}"
            if not attempted:
                # No call was written: a parser that cannot read plain text (gpt-oss's stub) cannot read any turn.
                raise ParserFailed(crash) from e
            info = None  # it crashed on the call the model wrote: that call's recorded error
        else:
            crash = None
        if info is None or not info.tools_called:
            if not attempted and crash is None:
                return ToolCallParse(content=content.strip())
            why = crash or f"the {self.description['tool']} parser found no valid call"
            return ToolCallParse(content=content.strip(), errors=[{"index": 0, "error": why, "raw": content}],
                                 unterminated=finish_reason == "length")
        calls, errors = [], []
        # Ids the model wrote inside its calls, in order (vLLM's mistral parser draws others at random).
        written = _WRITTEN_ID.findall(content) if self.call_id_rule else []
        for index, call in enumerate(info.tool_calls):
            name, raw_args = call.function.name, call.function.arguments
            try:
                arguments = json.loads(raw_args) if isinstance(raw_args, str) else raw_args
                if not isinstance(arguments, dict):
                    raise ValueError(f"arguments are a JSON {type(arguments).__name__}, not an object")
            except ValueError as e:
                errors.append({"index": index, "error": f"invalid arguments: {e}", "raw": f"{name} {raw_args}"})
                continue
            # An id the model wrote is part of its text; one vLLM drew at random is not.
            call_id = call.id if call.id and call.id in content else f"call_{turn}_{len(calls)}"
            if index < len(written) and is_valid(written[index], self.call_id_rule):
                call_id = written[index]
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        return ToolCallParse(content=(info.content or "").strip(), tool_calls=calls, errors=errors,
                             unterminated=finish_reason == "length")


def load_turn_parser(tokenizer: Any, *, reasoning: str | None, tool: str | None,
                     thinking_arg: str | None = None) -> TurnParser:
    """The parser of a run's output: vLLM's classes by name; regen's Qwen parser if vLLM has none at all.

    Raises:
        ParserUnavailable: This vLLM does not have a named parser (and regen's own does not cover it).
    """
    try:
        return VllmTurnParser(tokenizer, reasoning=reasoning, tool=tool, thinking_arg=thinking_arg)
    except ImportError as e:
        if reasoning in _REGEN_REASONING and tool in _REGEN_TOOL:
            log.warning("vLLM's parser modules cannot be imported here (%s); reading output with regen's own "
                        "Qwen parser (rows say parser.by = regen)", e)
            return RegenQwenParser(tokenizer, reasoning=reasoning, tool=tool)
        raise ParserUnavailable(f"this worker's vLLM cannot load its parsers ({e}); the run needs "
                                f"reasoning parser {reasoning!r}, tool parser {tool!r}") from e
    except KeyError as e:
        raise ParserUnavailable(f"this worker's vLLM has no parser {e}: the run needs reasoning parser "
                                f"{reasoning!r}, tool parser {tool!r}") from e
    except (ValueError, RuntimeError, TypeError) as e:
        # A class that refuses this model's tokenizer (vLLM 0.26's mistral reasoning parser refused every Hugging
        # Face one until regen built it another way): named as the run's parsers, not as a bare ValueError.
        raise ParserUnavailable(f"this worker's vLLM cannot build the run's parsers on this model's tokenizer "
                                f"(reasoning {reasoning!r}, tool {tool!r}): {type(e).__name__}: {e}") from e


def _reasoning_parser(name: str, tokenizer: Any, thinking_arg: str | None) -> Any:
    from targets.vllm_compat import reasoning_parser_class

    cls = reasoning_parser_class(name)
    try:
        if thinking_arg is None:
            return cls(tokenizer)
        try:
            return cls(tokenizer, chat_template_kwargs={thinking_arg: True})
        except TypeError:  # a vLLM whose parsers take no keyword arguments
            return cls(tokenizer)
    except ValueError as e:
        if "MistralTokenizer" not in str(e):
            raise
        return _think_tag_parser_on_this_tokenizer(cls, tokenizer, e)


def _think_tag_parser_on_this_tokenizer(cls: type, tokenizer: Any, refusal: ValueError) -> Any:
    """vLLM 0.26's ``mistral`` reasoning parser, built on the Hugging Face tokenizer regen renders with.

    Before its parser adapters (0.32 has them), vLLM's MistralReasoningParser refuses any tokenizer
    but mistral_common's (``vllm serve --tokenizer-mode mistral``). It wants it only to look up the ids
    of ``[THINK]`` and ``[/THINK]``; everything it reads after that is text. regen renders every target
    with its Jinja template through transformers, so the worker holds a Hugging Face tokenizer, whose
    vocabulary has the same two special tokens. The class's own base initialiser (vLLM's
    BaseThinkingReasoningParser) looks them up there, and vLLM's own reading code then runs as
    ``vllm serve`` runs it. Magistral's turns on vLLM 0.26 were refused outright without this
    (docs/results/h100-fidelity-2026-12-05b.txt).

    Raises:
        ValueError: ``refusal``, when the class is no think-tag parser this can build (nothing else is guessed).
    """
    try:
        from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser
    except ImportError:
        raise refusal from None
    if not issubclass(cls, BaseThinkingReasoningParser):
        raise refusal
    parser = cls.__new__(cls)
    BaseThinkingReasoningParser.__init__(parser, tokenizer)  # RuntimeError if the vocabulary lacks a tag
    return parser


def _extract_reasoning(parser: Any, text: str, request: Any) -> tuple[str | None, str | None]:
    # vLLM renamed extract_reasoning_content to extract_reasoning; both exist across 0.26-0.33.
    extract = getattr(parser, "extract_reasoning", None) or parser.extract_reasoning_content
    return extract(text, request)


def _first_str(obj: Any, *names: str) -> str | None:
    for name in names:
        try:
            value = getattr(obj, name, None)
        except Exception:  # noqa: BLE001 - a property that needs state it lacks
            value = None
        if isinstance(value, str) and value:
            return value
    return None


def _has(text: str, *markers: str | None) -> bool:
    return any(m and m in text for m in markers)


def _drop_leading(text: str, start: str | None) -> str:
    # The opening tag is either generated or already in the prompt: drop one leading copy.
    head = text.lstrip()
    return head[len(start):] if start and head.startswith(start) else text
