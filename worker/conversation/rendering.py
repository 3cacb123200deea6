"""The target's chat format: its own template renders conversations to ids, its parsers read turns back.

The ids handed to the engine are exactly ``tokenizer.apply_chat_template(messages,
tools=tools, add_generation_prompt=True, <thinking argument>=...)``: no text round
trip, no second tokenisation, so the prompt is what the target sees in production.
The thinking argument is the one the template reads (``enable_thinking``, DeepSeek-V3.1's
``thinking``; none where nothing switches it), as the run records it or, for a run
recorded without one, as rendering the loaded template shows (targets/template_probe.py).
The way back is the run's parsers (targets/parser_choice.py names them, targets/turn_parsers.py
loads vLLM's classes), one instance per run config, shared by the process's batches.

gpt-oss is the exception, as in vLLM: a run whose record says ``chat_format: harmony`` (or,
recorded before the family was known, whose loaded template or config is gpt-oss's) is
rendered with Harmony from the conversation, at the run's reasoning effort and fixed date,
and read by Harmony's parser on the ids (targets/harmony.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

from targets import harmony
from targets.parser_choice import AUTO, NONE, recorded_parsers, resolve_auto
from targets.template_probe import TemplateFormat, as_template_takes, probe_template
from targets.turn_parsers import TurnParser, load_turn_parser
from worker.conversation.dialogue import SampleError


class Renderer:
    def __init__(self, tokenizer: Any, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        template = tokenizer.chat_template or ""
        if isinstance(template, dict):  # several named templates
            template = "\n".join(f"{k}\n{v}" for k, v in sorted(template.items()))
        self.template_hash = hashlib.sha256(template.encode()).hexdigest()
        self._template = template
        self._names: dict[tuple[str | None, str | None], tuple[str | None, str | None]] = {}
        self._parsers: dict[tuple[str | None, str | None, str | None], TurnParser] = {}
        self._probed: tuple[TemplateFormat | None] | None = None

    @property
    def template_format(self) -> TemplateFormat | None:
        """What rendering the loaded template shows (targets/template_probe.py); None: of no known format."""
        if self._probed is None:
            self._probed = (probe_template(self._template) if self._template else None,)
        return self._probed[0]

    def thinking_arg_for(self, sampling: dict) -> str | None:
        """The chat-template argument that switches thinking: the run's, or the loaded template's."""
        recorded = sampling.get("thinking_arg", AUTO)
        if recorded != AUTO:
            return None if recorded == NONE else recorded
        found = self.template_format
        # A template of no known format keeps transformers' name for it.
        return found.thinking_arg if found else "enable_thinking"

    def history_arg_for(self, sampling: dict) -> str | None:
        """The keyword that keeps earlier turns' thoughts (Qwen3.6's ``preserve_thinking``): the run's, or the
        loaded template's where the run says AUTO; None for a run that records none (its template has none)."""
        recorded = sampling.get("history_arg")
        if recorded != AUTO:
            return recorded
        found = self.template_format
        return found.history_arg if found else None

    def is_harmony(self, sampling: dict) -> bool:
        """Whether the run renders with Harmony: as its record says, else as the loaded model is (gpt-oss)."""
        recorded = sampling.get("chat_format")
        if recorded is not None:
            return recorded == harmony.HARMONY
        found = self.template_format
        if found is not None:
            return found.chat_format == harmony.HARMONY
        return harmony.is_gpt_oss_model(str(getattr(self.tokenizer, "name_or_path", "")))

    def harmony_options(self, run: dict) -> dict | None:
        """The effort and date a Harmony run renders with; None for a Jinja run.

        Raises:
            SampleError: A Harmony run recorded without its date (it would be today's, different per worker).
        """
        sampling = run["sampling"]
        if not self.is_harmony(sampling):
            return None
        date = (run.get("provenance") or {}).get("harmony_start_date")
        if not date:
            raise SampleError("template_error", "a Harmony (gpt-oss) run must record harmony_start_date in its "
                                                "provenance; submit it again under a new name")
        return {"effort": sampling.get("reasoning_effort") or harmony.DEFAULT_EFFORT, "date": date}

    def parser_for(self, sampling: dict) -> TurnParser:
        """The parsers the run's record names; the template's where it says AUTO (or names none: an older run)."""
        if self.is_harmony(sampling):
            key = ("harmony", None, None)
            if key not in self._parsers:
                self._parsers[key] = harmony.HarmonyTurnParser()
            return self._parsers[key]
        recorded = recorded_parsers(sampling)
        if recorded not in self._names:
            choice = resolve_auto(recorded, str(getattr(self.tokenizer, "name_or_path", "")), self._template)
            self._names[recorded] = (choice.reasoning, choice.tool)
        names = self._names[recorded]
        arg = self.thinking_arg_for(sampling)
        key = (names[0], names[1], arg)
        if key not in self._parsers:
            self._parsers[key] = load_turn_parser(self.tokenizer, reasoning=names[0], tool=names[1],
                                                  thinking_arg=arg)
        return self._parsers[key]

    def render(self, messages: list[dict], tools: list[dict] | None, *, thinking: bool,
               thinking_arg: str | None = "enable_thinking", harmony_options: dict | None = None,
               template_kwargs: dict | None = None) -> list[int]:
        """The prompt's ids; ``template_kwargs`` are further keywords of the template (``preserve_thinking``)."""
        try:
            if harmony_options is not None:
                ids = harmony.render_prompt(messages, tools, **harmony_options)
            else:
                switch = {**(template_kwargs or {}), **({thinking_arg: thinking} if thinking_arg else {})}
                # regen keeps arguments as objects; a template that concatenates them as text gets JSON.
                found = self.template_format
                ids = self.tokenizer.apply_chat_template(
                    as_template_takes(messages, found.call_arguments if found else "object"), tools=tools or None,
                    add_generation_prompt=True, tokenize=True, return_dict=False, **switch,
                )
        except Exception as e:  # noqa: BLE001 - any template failure is this sample's, not the batch's
            raise SampleError("template_error", f"{type(e).__name__}: {str(e)[:300]}") from e
        ids = list(ids)
        # At least one token of room, or the engine would reject the request outright.
        if len(ids) >= self.max_model_len:
            raise SampleError("prompt_too_long",
                              f"prompt has {len(ids)} tokens; the model's context is {self.max_model_len}")
        return ids
