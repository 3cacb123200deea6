"""What a chat template does, found by rendering it: the call's wire format, the thought, the thinking switch.

Searching a template's text for markers guesses wrong as soon as a family writes
its format another way (DeepSeek-R1's template builds ``function<｜tool▁sep｜>``
from ``tool['type']``, so the literal text is nowhere in it). Rendering cannot be
fooled that way: a probe conversation (a user turn, an assistant turn with a thought
and one call with known arguments, the call's result) and the generation prompt are
rendered through the template, and the family is read off the output:

* the call's wire format: what surrounds the probe tool's name in the rendering;
* the thought: whether a prompt opens or closes ``<think>``, or the probe's thought
  is rendered inside think tags;
* the thinking switch: which chat-template argument (``enable_thinking``, DeepSeek-V3.1's
  ``thinking``) changes the generation prompt when set on and off; none: the template
  always thinks (the prompt opens a thought) or never does;
* the history keyword: a variable of the template that, set on and off, changes how an
  earlier assistant turn renders but not the prompt of a first turn (Qwen3.6's
  ``preserve_thinking`` keeps every earlier turn's thought), and what the template does without it.

Rendering uses transformers' own Jinja environment (what ``apply_chat_template`` uses),
with empty special tokens: the wire format is in the template's text, not the tokenizer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

#: The thinking arguments templates read, in the order they are tried.
THINKING_ARGS = ("enable_thinking", "thinking")
THINK_START, THINK_END = "<think>", "</think>"
#: Mistral's thought markers (Magistral 2507+: special tokens of tokenizer v13, read by vLLM's ``mistral`` parser).
MISTRAL_THINK_START, MISTRAL_THINK_END = "[THINK]", "[/THINK]"
#: gpt-oss: its family name, vLLM's parser names for it, and its thinking switch. vLLM serves it
#: through Harmony, not its Jinja template (targets/harmony.py); the template only identifies it.
HARMONY_FAMILY = "gpt_oss"
HARMONY_PARSERS = ("openai_gptoss", "openai")
EFFORT_ARG = "reasoning_effort"

_NAME = "regen_probe_lookup"
_ARGS = {"city": "Zzyzx"}
_THOUGHT = "regen probe thought"
_TOOL = {"type": "function", "function": {
    "name": _NAME, "description": "Look a city up.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@dataclass(frozen=True)
class TemplateFormat:
    """What rendering showed of one template."""

    family: str
    #: vLLM's parser names (None: no such parser, the family does not think / wrote no call).
    reasoning: str | None
    tool: str | None
    #: The chat-template argument that switches thinking; None when nothing switches it.
    thinking_arg: str | None
    #: "switch", "always" (the prompt opens a thought whatever is passed) or "never".
    thinking: str
    #: How the template takes a call's arguments: "object" (a dict, transformers' convention) or
    #: "json" (a JSON string it concatenates, as DeepSeek's templates do).
    call_arguments: str = "object"
    #: How prompts are rendered: "jinja" (the template, apply_chat_template) or "harmony" (gpt-oss:
    #: openai-harmony's encoding, as vLLM serves it; targets/harmony.py).
    chat_format: str = "jinja"
    #: The keyword that changes how earlier assistant turns render (Qwen3.6: ``preserve_thinking``); None: none does.
    history_arg: str | None = None
    #: What the template does without it: True when leaving it out renders as setting it true.
    history_default: bool = False

    def modes(self) -> tuple[str, ...]:
        """The ``--thinking`` modes this template can render ("effort": Harmony always reasons)."""
        return {"switch": ("on", "off", "mix"), "always": ("on",), "never": ("off",),
                "effort": ("on",)}[self.thinking]


def _render(template: str, messages: list[dict], *, tools: list[dict] | None = None, generation: bool,
            **kwargs: Any) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                        add_generation_prompt=generation, bos_token="", eos_token="", **kwargs)
    return rendered[0]


#: The probe call's id: 9 alphanumerics, the one form every template takes (Mistral's refuse any other).
_CALL_ID = "regen0001"


def _call_message(arguments: Any, content: str | None) -> list[dict]:
    call = {"id": _CALL_ID, "type": "function", "function": {"name": _NAME, "arguments": arguments}}
    return [{"role": "user", "content": "Where is Zzyzx?"},
            {"role": "assistant", "content": content, "reasoning_content": _THOUGHT, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": _CALL_ID, "name": _NAME, "content": "regen probe result"}]


#: The forms a call is tried in: arguments as a dict (transformers' convention) or a JSON string (DeepSeek's
#: templates concatenate them), the turn's text as None (R1 renders calls only then) or "" (Qwen3 needs text).
_CALL_FORMS = (("object", None), ("object", ""), ("json", None), ("json", ""))


def _rendered_call(template: str) -> tuple[str, str]:
    """The probe conversation rendered in the first form the template renders a call from, and that form's
    arguments ("object" or "json"); ("", "object") when it renders none."""
    for form, content in _CALL_FORMS:
        arguments = dict(_ARGS) if form == "object" else json.dumps(_ARGS)
        try:
            rendered = _render(template, _call_message(arguments, content), tools=[_TOOL], generation=False)
        except Exception:  # noqa: BLE001 - this form is not the template's
            continue
        if _tool_format(rendered) is not None:
            return rendered, form
    return "", "object"


def _tool_format(rendered: str) -> tuple[str, str] | None:
    """(family, tool parser) from the text around the probe call's name, after the tool list."""
    # Formats whose call is recognised by its own markers (the name may not be written: Kimi writes the id).
    if "<|tool_calls_section_begin|>" in rendered and f"<|tool_call_begin|>{_CALL_ID}" in rendered:
        return "kimi", "kimi_k2"                  # Kimi-K2: <|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS
    if re.search(r'\[TOOL_CALLS\]\s*\[\{"name":\s*"' + _NAME, rendered) or f"[TOOL_CALLS]{_NAME}[" in rendered:
        return "mistral", "mistral"               # Mistral: JSON list (v3-v7) or NAME[ARGS]/[CALL_ID] (v11+)
    # The tool list (system prompt) also names the tool: read the last occurrence, the call.
    at = rendered.rfind(_NAME)
    if at < 0:
        return None
    before, after = rendered[max(0, at - 40):at], rendered[at + len(_NAME):at + len(_NAME) + 40]
    if before.endswith("function<｜tool▁sep｜>") and after.startswith("\n```json"):
        return "deepseek", "deepseek_v3"          # DeepSeek-V3 / R1
    if after.startswith("<｜tool▁sep｜>"):
        return "deepseek", "deepseek_v31"         # DeepSeek-V3.1
    if before.endswith("<tool_call>") and "<arg_key>city</arg_key>" in after:
        return "glm45", "glm45" if after.startswith("\n") else "glm47"
    if before.endswith("<function=") or before.endswith("<function="):
        return "qwen3", "qwen3_coder"             # Qwen3-Coder / Qwen3.5 XML calls
    if before.endswith("<|start|>assistant to=functions."):
        return HARMONY_FAMILY, HARMONY_PARSERS[1]  # gpt-oss: the recipient in the header
    if before.rstrip().endswith('"name": "') or before.endswith('"name": "'):
        if "<|start_header_id|>" in rendered:
            return "llama3", "llama3_json"
        if "<tool_call>" in before:
            return "qwen3", "hermes"
    return None


def _family_of_prompt(prompt: str) -> str | None:
    """The family from the generation prompt alone (a template that renders no call)."""
    tail = prompt[-60:]
    for marker, family in (("<｜Assistant｜>", "deepseek"), ("<|assistant|>", "glm45"),
                           ("<|im_assistant|>assistant<|im_middle|>", "kimi"), ("[/INST]", "mistral"),
                           ("<|im_start|>assistant", "qwen3"), ("<|start_header_id|>assistant", "llama3"),
                           ("<|start|>assistant", HARMONY_FAMILY)):
        if marker in tail:
            return family
    return None


def prompt_thought(prompt: str) -> str | None:
    """"opened" when the prompt ends inside a thought, "closed" after an empty one, else None."""
    tail = prompt.rstrip()
    if tail.endswith(THINK_START):
        return "opened"
    if tail.endswith(THINK_END):
        return "closed"
    return None


#: The reasoning parser of a thinking family: (switchable, always thinking).
_REASONING = {"deepseek": ("deepseek_v3", "deepseek_r1"), "glm45": ("glm45", "glm45"), "qwen3": ("qwen3", "qwen3"),
              "kimi": ("kimi_k2", "kimi_k2"), "mistral": ("mistral", "mistral")}


def probe_template(template: str) -> TemplateFormat | None:
    """The template's format as rendering shows it; None when it is of no format regen knows."""
    user = [{"role": "user", "content": "Hello"}]
    try:
        plain = _render(template, user, generation=True)
        switched = {arg: (_render(template, user, generation=True, **{arg: True}),
                          _render(template, user, generation=True, **{arg: False})) for arg in THINKING_ARGS}
    except Exception:  # noqa: BLE001 - a template that cannot render a plain chat is of no known format
        return None
    rendered_call, call_arguments = _rendered_call(template)
    call = _tool_format(rendered_call)
    family = call[0] if call else _family_of_prompt(plain)
    if family is None:
        return None
    if family == HARMONY_FAMILY:
        return _harmony_format(template, user, call_arguments)
    arg = next((a for a in THINKING_ARGS if switched[a][0] != switched[a][1]), None)
    prompts = [plain, *(p for a in THINKING_ARGS for p in switched[a])]
    flat = rendered_call.replace("\n", "")
    # Magistral writes a turn's thought as [THINK]...[/THINK] (its prompt leaves the thought to the model).
    thought_rendered = f"{THINK_START}{_THOUGHT}" in flat or (
        family == "mistral" and f"{MISTRAL_THINK_START}{_THOUGHT}{MISTRAL_THINK_END}" in flat)
    thinks = thought_rendered or any(prompt_thought(p) for p in prompts)
    if arg is not None and thinks:
        thinking = "switch"
    elif thinks and (prompt_thought(plain) == "opened" or thought_rendered):
        # The prompt opens the thought (R1), or the model opens it itself after a prompt that
        # leaves it free, as the template renders its turns (Kimi-K2-Thinking, Magistral): nothing turns it off.
        thinking, arg = "always", None
    else:
        thinking, arg = "never", None
    reasoning = None
    if thinking != "never":
        pair = _REASONING.get(family)
        reasoning = None if pair is None else pair[0] if thinking == "switch" else pair[1]
    history = history_switch(template)
    return TemplateFormat(family=family, reasoning=reasoning, tool=call[1] if call else None,
                          thinking_arg=arg, thinking=thinking, call_arguments=call_arguments,
                          history_arg=history[0] if history else None,
                          history_default=history[1] if history else False)


def thinking_switch(template: str) -> str | None:
    """The chat-template argument that changes the generation prompt when set on and off; None when none does
    (also when the template cannot render a plain chat). For a template of no family regen knows."""
    user = [{"role": "user", "content": "Hello"}]
    for arg in THINKING_ARGS:
        try:
            if _render(template, user, generation=True, **{arg: True}) != \
                    _render(template, user, generation=True, **{arg: False}):
                return arg
        except Exception:  # noqa: BLE001 - a template that raises for this argument has no such switch
            continue
    return None


#: Variables every template may read that are not switches of its own (transformers passes them, or they are
#: Jinja's): never tried as history keywords.
_PASSED = frozenset({"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
                     "raise_exception", "strftime_now", "namespace", "range", "loop", "true", "false", "none",
                     *THINKING_ARGS, EFFORT_ARG})
#: A conversation whose earlier assistant turn has a thought: the turn a history keyword changes.
_HISTORY = [{"role": "user", "content": "Where is Zzyzx?"},
            {"role": "assistant", "content": "In California.", "reasoning_content": _THOUGHT},
            {"role": "user", "content": "And Baker?"}]


def template_variables(template: str) -> set[str]:
    """The variables a template reads that it does not set itself (Jinja's own analysis)."""
    import jinja2
    from jinja2 import meta

    try:
        parsed = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError:
        # A tag of transformers' own (``{% generation %}``): the names the template tests for being defined.
        return set(re.findall(r"\b([A-Za-z_]\w*) is (?:not )?(?:defined|undefined)", template))
    return set(meta.find_undeclared_variables(parsed))


def history_switch(template: str) -> tuple[str, bool] | None:
    """(keyword, its default) for the first variable of the template that, rendered true and false, changes how an
    earlier assistant turn renders while a first turn's prompt stays the same; None when none does.

    Found by rendering, as the thinking switch is: whatever the template calls it. The default is True when the
    conversation rendered without the keyword equals it rendered with the keyword true.
    """
    first = [_HISTORY[0]]
    for name in sorted(template_variables(template) - _PASSED):
        try:
            if _render(template, first, generation=True, **{name: True}) != \
                    _render(template, first, generation=True, **{name: False}):
                continue  # it changes the prompt itself (a date, a system text): not a history keyword
            on, off = (_render(template, _HISTORY, generation=True, **{name: v}) for v in (True, False))
            if on == off:
                continue
            return name, _render(template, _HISTORY, generation=True) == on
        except Exception:  # noqa: BLE001 - a variable the template cannot take as a boolean is not such a keyword
            continue
    return None


def _harmony_format(template: str, user: list[dict], call_arguments: str) -> TemplateFormat:
    """gpt-oss: always reasons, at the effort ``reasoning_effort`` names (the template writes it into the system
    message; Harmony has no mode without reasoning)."""
    try:
        efforts = {_render(template, user, generation=True, **{EFFORT_ARG: e}) for e in ("low", "high")}
    except Exception:  # noqa: BLE001 - a gpt-oss template without the argument: the effort is Harmony's alone
        efforts = set()
    return TemplateFormat(family=HARMONY_FAMILY, reasoning=HARMONY_PARSERS[0], tool=HARMONY_PARSERS[1],
                          thinking_arg=EFFORT_ARG if len(efforts) == 2 else None, thinking="effort",
                          call_arguments=call_arguments, chat_format="harmony")


def as_template_takes(messages: list[dict], call_arguments: str) -> list[dict]:
    """``messages`` with each call's arguments in the form the template takes (a JSON string for "json")."""
    if call_arguments != "json":
        return messages
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [_json_arguments(call) for call in calls]}
        out.append(message)
    return out


def _json_arguments(call: dict) -> dict:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        return call
    return {**call, "function": {**function, "arguments": json.dumps(arguments, ensure_ascii=False)}}
