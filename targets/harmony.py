"""gpt-oss's chat format: prompts rendered and generations read with Harmony, as vLLM serves the family.

vLLM never renders gpt-oss through its Jinja template: for a ``gpt_oss`` model its chat
endpoint builds Harmony messages (``openai_harmony``) from the request and renders them
with Harmony's encoding, and reads the output with Harmony's parser on the token ids.
The published template differs from that rendering after a tool call (the result's header
puts ``to=assistant`` before the channel, and quotes the result), and embeds today's date.
So a gpt-oss run (targets/template_probe.py finds the family; the run records
``chat_format: harmony``) goes through this module instead of ``apply_chat_template``:

* **Prompts** are vLLM's own: its ``harmony_utils`` turns regen's conversation into Harmony
  messages (system: the run's reasoning effort and its fixed start date; developer: the
  first system message's text as instructions, and the tools; prior turns with their
  analysis and commentary; tool results as ``functions.NAME`` messages to the assistant),
  and renders them as ``vllm serve`` does (analysis before the last final answer dropped,
  the tool-call headers in the form gpt-oss was trained on).
* **Generations** are read by Harmony's ``StreamableParser`` on the engine's ids:
  ``analysis`` is the thought, ``final`` (and ``commentary`` to no one) the answer, each
  ``commentary`` message to ``functions.NAME`` a call (every one of them, in order).
  An action ends at ``<|call|>``, so a turn of parallel calls is made one action at a time,
  each after the results of the calls before it, as a chat client drives ``vllm serve``. A thought cut off by max_tokens is
  all thought; a call cut off, or ids Harmony cannot parse, are recorded errors with the
  raw text, never dropped.
* **The thinking switch** is the reasoning effort (low, medium, high): Harmony always
  reasons, so there is no "off".
* **The date** is fixed per run at submit (``VLLM_SYSTEM_START_DATE`` if set, as vLLM pins
  it, else the submit's UTC date) and recorded in its provenance, so every worker, retry
  and re-run renders the same prompt.

The o200k vocabulary comes with the ``oss-harmony`` wheel (compiled into its module: no
tiktoken download, nothing read at run time), so this works with no network.
Nothing here imports vLLM or openai_harmony at module load.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.errors import ConfigError
from targets.parsing import ReasoningSplit, ToolCallParse
from targets.template_probe import EFFORT_ARG, HARMONY_FAMILY, HARMONY_PARSERS, TemplateFormat

#: ``runs.sampling.chat_format`` of a run rendered with Harmony.
HARMONY = "harmony"
#: Harmony's reasoning efforts; "medium" is its default (SystemContent.new()) and vLLM's when a request names none.
EFFORTS = ("low", "medium", "high")
DEFAULT_EFFORT = "medium"
#: vLLM's variable that pins the system message's date; read here at submit only.
DATE_ENV = "VLLM_SYSTEM_START_DATE"
#: What a gpt-oss model of no readable template renders as (its ``config.json`` says ``gpt_oss``).
HARMONY_FORMAT = TemplateFormat(family=HARMONY_FAMILY, reasoning=HARMONY_PARSERS[0], tool=HARMONY_PARSERS[1],
                                thinking_arg=EFFORT_ARG, thinking="effort", chat_format=HARMONY)


# --- submit: which runs take this path, their effort and date ----------------------------------


def is_gpt_oss_model(model_dir: str | Path) -> bool:
    """Whether a local model's ``config.json`` names the gpt_oss architecture (what vLLM switches on)."""
    config = Path(model_dir) / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type") == "gpt_oss"
    except (OSError, ValueError):
        return False


def checked_effort(effort: str | None) -> str:
    """The run's reasoning effort; ``none`` and anything else Harmony lacks are refused."""
    if effort is None:
        return DEFAULT_EFFORT
    if effort not in EFFORTS:
        raise ConfigError(f"--reasoning-effort {effort!r}: Harmony (gpt-oss) takes {', '.join(EFFORTS)}; it has "
                          "no mode without reasoning")
    return effort


def start_date() -> str:
    """The date a new run's system messages carry: ``VLLM_SYSTEM_START_DATE``, else today (UTC), YYYY-MM-DD."""
    pinned = os.environ.get(DATE_ENV)
    if pinned:
        try:
            datetime.date.fromisoformat(pinned)
        except ValueError as e:
            raise ConfigError(f"{DATE_ENV}={pinned!r} is not a YYYY-MM-DD date") from e
        return pinned
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


#: The wheels that provide the ``openai_harmony`` module: vLLM 0.32's (the vocabulary compiled in) and
#: vLLM 0.26's, which reads o200k_base.tiktoken from ``TIKTOKEN_ENCODINGS_BASE`` or downloads it.
HARMONY_DISTRIBUTIONS = ("oss-harmony", "openai-harmony")


def harmony_library() -> tuple[str, str]:
    """(distribution, version) of the installed Harmony wheel, for rows' parser record and build keys."""
    from importlib.metadata import PackageNotFoundError, version

    for name in HARMONY_DISTRIBUTIONS:
        try:
            return name, version(name)
        except PackageNotFoundError:
            continue
    raise ConfigError(f"no Harmony wheel is installed (one of {', '.join(HARMONY_DISTRIBUTIONS)}): "
                      "gpt-oss targets need it (vLLM depends on one)")


# --- worker: rendering ------------------------------------------------------------------------


def _harmony_utils() -> Any:
    from targets.vllm_compat import harmony_utils

    return harmony_utils()


def encoding() -> Any:
    """Harmony's gpt-oss encoding (o200k_harmony), loaded once per process by vLLM's helper."""
    _cache_special_token_regex()
    return _harmony_utils().get_encoding()


def _cache_special_token_regex() -> None:
    """Build Harmony's special-token regex once per set of tokens, not on every ``encode``.

    ``HarmonyEncoding.encode`` escapes and joins all 1,090 special tokens into a regex on each
    call (to refuse them in plain text); vLLM's tool-call header rewrite calls it for every
    message of a prompt, so a prompt cost ~0.1 s of the engine loop's CPU (cProfile of the tiny
    model's data rendering on this machine: 0.19 s an example before, 0.06 s after). The regex,
    and so every result, is the same.
    """
    import openai_harmony

    regex = getattr(openai_harmony, "_special_token_regex", None)
    if regex is not None and not hasattr(regex, "cache_info"):
        openai_harmony._special_token_regex = functools.lru_cache(maxsize=16)(regex)


def as_chat_request_messages(messages: list[dict]) -> list[dict]:
    """regen's messages as an OpenAI chat request carries them to vLLM: a thought in ``reasoning``, a call's
    arguments as JSON text, a tool result naming its call by id (vLLM finds the function's name from it)."""
    out = []
    for message in messages:
        message = dict(message)
        thought = message.pop("reasoning_content", None)
        if message["role"] == "assistant" and thought:
            message["reasoning"] = thought
        if message.get("tool_calls"):
            message["tool_calls"] = [_json_call(call) for call in message["tool_calls"]]
        out.append(message)
    return out


def _json_call(call: dict) -> dict:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        function["arguments"] = json.dumps(arguments, ensure_ascii=False)
    return {**call, "function": function}


def harmony_messages(messages: list[dict], tools: list[dict] | None, *, effort: str, date: str) -> list[Any]:
    """The Harmony messages vLLM's chat endpoint builds for this conversation (system, developer, the rest)."""
    hu = _harmony_utils()
    from targets.vllm_compat import chat_tool_class

    chat = as_chat_request_messages(messages)
    instructions, rest = hu.extract_instructions_from_messages(chat)
    out = [hu.get_system_message(reasoning_effort=effort, start_date=date)]
    if instructions or tools:
        tool_params = [chat_tool_class()(**tool) for tool in tools] if tools else None
        out.append(hu.get_developer_message(instructions=instructions, tools=tool_params))
    out.extend(hu.parse_chat_inputs_to_harmony_messages(rest))
    return out


def render_prompt(messages: list[dict], tools: list[dict] | None, *, effort: str, date: str) -> list[int]:
    """The prompt ids ``vllm serve`` renders for this conversation, ending ``<|start|>assistant``."""
    return list(_harmony_utils().render_for_completion(harmony_messages(messages, tools, effort=effort, date=date)))


def stop_ids() -> list[int]:
    """The ids that end an assistant action: ``<|return|>`` (answered) and ``<|call|>`` (called a tool)."""
    return list(encoding().stop_tokens_for_assistant_actions())


# --- worker: reading a generation -------------------------------------------------------------


@dataclass
class _Read:
    reasoning: list[str]
    content: list[str]
    calls: list[tuple[str, str, str | None]]   # (recipient, text, content type)
    #: The message the ids stopped inside: (channel, recipient, text so far), when one was open.
    open: tuple[str | None, str | None, str] | None
    error: str | None


def _read(token_ids: list[int]) -> _Read:
    from openai_harmony import HarmonyError, Role, StreamableParser

    parser = StreamableParser(encoding(), role=Role.ASSISTANT)
    error = None
    for token in token_ids:
        try:
            parser.process(token)
        except HarmonyError as e:
            error = f"Harmony cannot parse the completion: {e}"
            break
    current = None
    if error is None and parser.current_content:
        current = (parser.current_channel, parser.current_recipient, parser.current_content)
    read = _Read([], [], [], current, error)
    for message in parser.messages:
        if message.author.role != "assistant" or not message.content:
            continue
        text = "".join(getattr(part, "text", "") for part in message.content)
        recipient = _recipient(message.recipient)
        if recipient:
            read.calls.append((recipient, text, message.content_type))
        elif message.channel == "analysis":
            read.reasoning.append(text)
        elif message.channel in ("final", "commentary"):
            read.content.append(text)
    return read


def _recipient(recipient: str | None) -> str | None:
    # Older Harmony read "functions.x <|constrain|>json" as the recipient (vLLM strips it the same way).
    if not recipient:
        return None
    return recipient.split("<|constrain|>", 1)[0].strip() or None


class HarmonyTurnParser:
    """One gpt-oss turn read by Harmony's parser on its token ids (the TurnParser of targets/turn_parsers.py)."""

    #: Harmony ends an action at ``<|call|>`` and vLLM stops there (a stop id of the encoding), so gpt-oss makes a
    #: turn's several calls one action at a time, each after the results of those before it: the dialogue
    #: (worker/conversation/dialogue.py) splices each action's results and generates again until the source
    #: turn's calls are all made. Ids holding several commentary calls (an engine run without that stop) are
    #: read into all of them, in order.
    one_call_per_action = True

    def __init__(self, *, reasoning: str | None = HARMONY_PARSERS[0], tool: str | None = HARMONY_PARSERS[1]):
        library = " ".join(harmony_library())
        self.description = {"reasoning": reasoning, "tool": tool, "by": library, "chat_format": HARMONY}
        # Reasoning tokens are counted by channel, not by an end-of-thought id.
        self.think_end_id = None
        self._stops = set(stop_ids())

    def thinking_after(self, prompt_ids: list[int], thinking: bool) -> bool:
        return True  # Harmony always reasons; the completion opens its own channel

    def parse(self, generation: Any, *, thinking: bool, tools: list[dict] | None,
              turn: int) -> tuple[ReasoningSplit, ToolCallParse]:
        ids = list(generation.token_ids)
        read = _read(ids)
        cut = generation.finish_reason == "length"
        reasoning = list(read.reasoning)
        content = list(read.content)
        errors: list[dict] = []
        truncated_in_reasoning = stopped_in_thought = False
        if read.error is not None:
            errors.append({"index": 0, "error": read.error, "raw": encoding().decode(ids)})
        elif read.open is not None:
            channel, recipient, text = read.open
            recipient = _recipient(recipient)
            if recipient:  # a call cut off (or stopped) before <|call|>
                errors.append({"index": len(read.calls), "error": "the call has no end (<|call|>)",
                               "raw": f"{recipient} {text}"})
            elif channel == "analysis":
                reasoning.append(text)
                truncated_in_reasoning = cut and not content
                stopped_in_thought = not cut  # the model ended its turn inside its thought: malformed
            else:
                content.append(text)
        calls = []
        for index, (recipient, text, _content_type) in enumerate(read.calls):
            if not recipient.startswith("functions."):
                errors.append({"index": index, "error": f"a call to {recipient}, not to a function", "raw": text})
                continue
            name = recipient.removeprefix("functions.")
            try:
                arguments = json.loads(text)
                if not isinstance(arguments, dict):
                    raise ValueError(f"arguments are a JSON {type(arguments).__name__}, not an object")
            except ValueError as e:
                errors.append({"index": index, "error": f"invalid arguments: {e}", "raw": f"{name} {text}"})
                continue
            calls.append({"id": f"call_{turn}_{len(calls)}", "type": "function",
                          "function": {"name": name, "arguments": arguments}})
        answer = "\n".join(content)
        split = ReasoningSplit(reasoning_content="\n".join(reasoning), content=answer,
                               truncated_in_reasoning=truncated_in_reasoning,
                               think_tags_ok=read.error is None and not stopped_in_thought)
        return split, ToolCallParse(content=answer, tool_calls=calls, errors=errors,
                                    unterminated=cut and bool(errors))
