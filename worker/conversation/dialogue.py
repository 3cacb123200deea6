"""On-policy regeneration of one conversation, turn by turn, engine-agnostic.

Every source assistant turn is generated again by the target model, conditioned on
the model's *own* earlier answers: the source's assistant text is never put in a
context. Tools are not executed: when the model calls the same tools the source
called, the source's cached results are spliced in after the model's calls; when it
does not, the conversation stops there, because a cached result for a call the
model did not make would be another model's trajectory.

Two callables connect this module to an engine, so it never imports vLLM or torch:
``render(messages, tools) -> prompt ids`` (the model's chat template with
``add_generation_prompt=True``) and ``generate(prompt ids, turn) -> Generation``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ledger.errors import RegenError
from ledger.quality import unoffered_calls
from targets.call_ids import with_valid_ids
from targets.parsing import ReasoningSplit, ToolCallParse
from targets.turn_parsers import RegenQwenParser, TurnParser
from worker.conversation.splice import call_name, differ_reason, splice_all, splice_some
from worker.engine.loop_watch import LOOP_FINISH

_ROLES = frozenset({"system", "user", "assistant", "tool"})

#: ``(messages, tools) -> prompt token ids``: the chat template, add_generation_prompt=True.
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], list[int]]
#: ``(prompt token ids, turn index) -> Generation``.
Generate = Callable[[list[int], int], Awaitable["Generation"]]


class SampleError(RegenError):
    """This one conversation cannot be regenerated; the rest of the batch goes on.

    ``reason`` is a short stable code (``template_error``, ``prompt_too_long``,
    ``invalid_sample``) and ``detail`` says why. ``render`` and ``generate`` may raise
    it themselves with their own reason.
    """

    def __init__(self, reason: str, detail: str, *, turn: int | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.turn = turn


@dataclass(frozen=True)
class Generation:
    """What the engine returned for one prompt."""

    prompt_token_ids: list[int]
    #: Completion ids straight from the engine, stop token included if it emitted one.
    token_ids: list[int]
    #: "stop" | "length" | "abort" | whatever else the engine reports.
    finish_reason: str
    #: The engine's stop token id or stop string, when it has one.
    stop_reason: int | str | None = None
    #: The completion as text, where the engine decoded it. regen's engine does not
    #: (worker/conversation/generation.py asks vLLM not to): the parsers decode ``token_ids`` once.
    text: str | None = None


@dataclass
class ConversationResult:
    """The regenerated conversation and one generation event per assistant turn.

    Token totals are sums over ``events``; ``reasoning_tokens``/``answer_tokens`` are
    None when the caller gave no ``think_end_id``.
    """

    messages: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    #: None when every turn was regenerated; otherwise ``"code"`` or ``"code: detail"``.
    stop_reason: str | None = None
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int | None = None
    answer_tokens: int | None = None
    tool_calls: int = 0
    #: The engine's finish reason of the last event (None when nothing was generated).
    finish_reason: str | None = None

    @property
    def stop_code(self) -> str | None:
        """The stable part of ``stop_reason`` (before ``:``), for grouping in SQL or stats."""
        return None if self.stop_reason is None else self.stop_reason.split(":", 1)[0]


async def regenerate_conversation(
    sample: dict[str, Any],
    *,
    thinking: bool,
    render: Render,
    generate: Generate,
    max_turns: int = 64,
    think_end_id: int | None = None,
    parser: TurnParser | None = None,
    on_tool_mismatch: str = "splice",
) -> ConversationResult:
    """Regenerate every assistant turn of ``sample`` with the target model.

    Args:
        sample: A normalised conversation (docs/CONTRACTS.md): ``messages`` and ``tools``.
        thinking: Whether ``render`` enables thinking; decides how text is split.
        render: ``(messages, tools) -> prompt token ids``; errors become ``template_error``.
        generate: ``(prompt ids, turn index) -> Generation``.
        max_turns: At most this many generations; more stops with ``"max_turns"``.
        think_end_id: The ``</think>`` token id, to count reasoning and answer tokens
            from the engine's ids; without it those counts are None.
        parser: Splits each generated turn into thought, answer and tool calls
            (targets/turn_parsers.py: the run's vLLM parsers); default regen's Qwen parser.
        on_tool_mismatch: A call whose arguments differ from the source call whose result would follow it:
            "splice" the result anyway (the turn's event lists it under ``tool_args_differ``), or "stop" the
            conversation at that call (``tool_args_differ: ...``).

    Returns:
        The regenerated conversation, its events and why it stopped early, if it did.

    Raises:
        SampleError: The sample is malformed, or its first turn could not be rendered or
            generated. A ``SampleError`` in a later turn stops the conversation instead,
            keeping the turns already generated. A parser that raises fails the sample
            (``parser_error``, naming the parser) in any turn: its turn cannot be read. Any
            other exception from ``generate`` (engine failure) propagates unchanged.
    """
    source = _checked_messages(sample)
    if on_tool_mismatch not in ("splice", "stop"):
        raise ValueError(f"on_tool_mismatch must be splice or stop, not {on_tool_mismatch!r}")
    walk = _Walk(sample.get("tools") or None, thinking, render, generate, max_turns, think_end_id,
                 parser or RegenQwenParser(), sample_key=str(sample.get("sample_id", "")),
                 on_tool_mismatch=on_tool_mismatch)
    stop: str | None = None

    i = 0
    while i < len(source) and stop is None:
        message = source[i]
        if message["role"] != "assistant":
            # Tool messages that follow an assistant turn are consumed below; one found
            # here belongs to no call and is kept as context, like a user message.
            walk.context.append(dict(message))
            i += 1
            continue
        end = i + 1
        while end < len(source) and source[end]["role"] == "tool":
            end += 1
        stop = await walk.turn(
            source_calls=message.get("tool_calls") or [],
            source_results=source[i + 1 : end],
            source_continues=i + 1 < len(source),
        )
        i = end

    # A conversation that ends on the user (or on tool results) asks for one more answer.
    if stop is None and source[-1]["role"] in ("user", "tool"):
        stop = await walk.turn(source_calls=[], source_results=[], source_continues=False)
    if not walk.events and stop is None:
        raise SampleError("invalid_sample", "no assistant turn to regenerate and no final user message")
    return _result(walk.context, walk.events, stop)


@dataclass
class _Walk:
    """The state of one conversation being regenerated: its context and events so far."""

    tools: list[dict[str, Any]] | None
    thinking: bool
    render: Render
    generate: Generate
    max_turns: int
    think_end_id: int | None
    parser: TurnParser
    #: Derives the call ids a template demands (targets/call_ids.py), the same on every retry.
    sample_key: str = ""
    #: "splice" or "stop" at a call whose arguments differ from its source call's (regenerate_conversation).
    on_tool_mismatch: str = "splice"
    context: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    async def turn(
        self,
        *,
        source_calls: list[dict[str, Any]],
        source_results: list[dict[str, Any]],
        source_continues: bool,
    ) -> str | None:
        """Generate one assistant turn, append it (and spliced tool results) to the context.

        A parser that reads one call per action (``one_call_per_action``: gpt-oss, whose actions end
        at ``<|call|>``) regenerates a turn of several calls as several generations, each after the
        results of the calls before it, until the model has made all the source's calls.

        Returns the conversation's stop reason, or None to go on.
        """
        while True:
            stop, left = await self._action(source_calls, source_results, source_continues)
            if left is None:
                return stop
            source_calls, source_results = left

    async def _action(
        self,
        source_calls: list[dict[str, Any]],
        source_results: list[dict[str, Any]],
        source_continues: bool,
    ) -> tuple[str | None, tuple[list[dict[str, Any]], list[dict[str, Any]]] | None]:
        """One generation of the turn: (stop reason, None), or (None, the source calls and results still to
        be made) when the model made only some of the turn's calls in this action."""
        turn = len(self.events)
        if turn >= self.max_turns:
            return "max_turns", None
        try:
            generation = await self._render_and_generate(turn)
        except SampleError as e:
            if not self.events:
                raise
            # A later turn that cannot be rendered (typically: the context outgrew the
            # model) still leaves the earlier turns valid, on-policy training data.
            return f"{e.reason}: {e.detail}", None

        try:
            # The prompt decides whether the completion starts in a thought (turn_parsers.py).
            thinking = self.parser.thinking_after(generation.prompt_token_ids, self.thinking)
            split, parsed = self.parser.parse(generation, thinking=thinking, tools=self.tools, turn=turn)
        except Exception as e:  # noqa: BLE001 - a parser that raises fails this sample, never the batch
            raise SampleError("parser_error", f"{_parser_name(self.parser)} raised {type(e).__name__}: "
                                              f"{str(e)[:300]}", turn=turn) from e
        if parsed.tool_calls:
            # Ids the template refuses (Mistral's: 9 alphanumerics) become the source's or derived ones.
            parsed = replace(parsed, tool_calls=with_valid_ids(
                parsed.tool_calls, getattr(self.parser, "call_id_rule", None), sample_key=self.sample_key,
                turn=turn, source_calls=source_calls))
        self.context.append(_assistant_message(split, parsed))
        counts = _count_reasoning(generation.token_ids, thinking, self.think_end_id)
        self.events.append(_event(turn, len(self.context) - 1, generation, split, parsed, counts))

        if generation.finish_reason == "length":
            # Later turns would be conditioned on an answer the model never finished.
            return "truncated", None
        if generation.finish_reason == "abort":
            return "aborted", None
        if generation.finish_reason == LOOP_FINISH:
            # Stopped while generating: it met the repetition criterion (worker/engine/loop_watch.py); the row is
            # classified repetition_loop by the same rule, at the length it had.
            return f"repetition_loop: stopped at {len(generation.token_ids)} tokens", None
        if generation.finish_reason != "stop":
            return f"unexpected_finish: {generation.finish_reason}", None
        if parsed.errors:
            return f"tool_call_invalid: {parsed.errors[0]['error']}", None
        if not source_continues:
            return None, None
        unoffered = unoffered_calls(parsed.tool_calls, self.tools) if self.tools else []
        if unoffered and not set(unoffered) <= {call_name(call) for call in source_calls}:
            # A tool the sample's list does not offer, and the source never called: there
            # is no result to splice after it. The row keeps the call; its quality class
            # says unoffered_tool (also when the source made the same call: then it goes
            # on). A sample with no tool list is a divergence below: its tools are unknown.
            return f"tool_not_offered: {','.join(unoffered)}", None
        if (getattr(self.parser, "one_call_per_action", False) and parsed.tool_calls
                and len(parsed.tool_calls) < len(source_calls)):
            # Some of the turn's calls: their results now, the model makes the others after seeing them.
            spliced, calls_left, results_left, stop, differ = splice_some(
                parsed.tool_calls, source_calls, source_results)
            if self._mismatched(differ):
                return differ_reason(differ), None
            self.context.extend(spliced)
            return (stop, None) if stop else (None, (calls_left, results_left))
        spliced, stop, differ = splice_all(parsed.tool_calls, source_calls, source_results)
        if self._mismatched(differ):
            return differ_reason(differ), None
        self.context.extend(spliced)
        return stop, None

    def _mismatched(self, differ: list[dict[str, Any]]) -> bool:
        """Record on the turn's event the calls whose spliced result answers other arguments; True when the
        run stops there instead (their results are then not spliced, and the event says so)."""
        stop = bool(differ) and self.on_tool_mismatch == "stop"
        self.events[-1]["tool_args_differ"] = [{**d, "spliced": not stop} for d in differ]
        return stop

    async def _render_and_generate(self, turn: int) -> Generation:
        try:
            # A copy: render may keep the list, and the context grows after this call.
            prompt_ids = self.render(list(self.context), self.tools)
        except SampleError as e:
            e.turn = turn
            raise
        except Exception as e:  # any template or tokenizer failure is this sample's problem
            raise SampleError("template_error", f"{type(e).__name__}: {e}", turn=turn) from e
        try:
            return await self.generate(prompt_ids, turn)
        except SampleError as e:
            e.turn = turn
            raise


def _assistant_message(split: ReasoningSplit, parsed: ToolCallParse) -> dict[str, Any]:
    """The regenerated turn as a message the chat template can render again.

    ``reasoning_content`` stays in the message: Qwen3's template itself drops the thought
    of turns before the last user query and keeps it within a tool-calling loop. With an
    invalid call the answer is kept whole, as generated, and carries no ``tool_calls``.
    """
    message: dict[str, Any] = {"role": "assistant", "reasoning_content": split.reasoning_content}
    if parsed.errors:
        message["content"] = split.content
    else:
        message["content"] = parsed.content
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
    return message


def _event(
    turn: int,
    message_index: int,
    generation: Generation,
    split: ReasoningSplit,
    parsed: ToolCallParse,
    counts: tuple[int | None, int | None],
) -> dict[str, Any]:
    """The training record of one generation: engine ids, loss mask and quality flags."""
    prompt = list(generation.prompt_token_ids)
    completion = list(generation.token_ids)
    reasoning_tokens, answer_tokens = counts
    return {
        "turn": turn,
        "message_index": message_index,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "loss_mask": [0] * len(prompt) + [1] * len(completion),
        "finish_reason": generation.finish_reason,
        "engine_stop_reason": generation.stop_reason,
        "is_tool_call": bool(parsed.tool_calls or parsed.errors),
        "reasoning_tokens": reasoning_tokens,
        "answer_tokens": answer_tokens,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
        "tool_call_errors": parsed.errors,
        # Calls whose spliced result answers other arguments (worker/conversation/splice.py); set after splicing.
        "tool_args_differ": [],
        "truncated_in_reasoning": split.truncated_in_reasoning,
        "think_tags_ok": split.think_tags_ok,
    }


def _count_reasoning(
    completion: list[int], thinking: bool, think_end_id: int | None
) -> tuple[int | None, int | None]:
    # Counted on the engine's ids, never by re-tokenising text (DESIGN.md, choice 8).
    """Completion ids before / after the first ``</think>`` id (the tag itself in neither)."""
    if think_end_id is None:
        return None, None
    if not thinking:
        return 0, len(completion)
    try:
        k = completion.index(think_end_id)
    except ValueError:
        return len(completion), 0
    return k, len(completion) - k - 1


def _parser_name(parser: TurnParser) -> str:
    """The parser as the ledger names it: ``reasoning <name>, tool <name>``."""
    described = getattr(parser, "description", None) or {}
    return (f"parser (reasoning {described.get('reasoning') or 'none'}, tool {described.get('tool') or 'none'}, "
            f"by {described.get('by', '?')})")


def _checked_messages(sample: dict[str, Any]) -> list[dict[str, Any]]:
    messages = sample.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SampleError("invalid_sample", "no messages")
    for n, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES:
            raise SampleError("invalid_sample", f"message {n} has role {role!r}")
    return messages


def _result(
    messages: list[dict[str, Any]], events: list[dict[str, Any]], stop: str | None
) -> ConversationResult:
    def total(key: str) -> int | None:
        values = [event[key] for event in events]
        return None if any(v is None for v in values) else sum(values)

    return ConversationResult(
        messages=messages,
        events=events,
        stop_reason=stop,
        turns=len(events),
        prompt_tokens=sum(e["usage"]["prompt_tokens"] for e in events),
        completion_tokens=sum(e["usage"]["completion_tokens"] for e in events),
        reasoning_tokens=total("reasoning_tokens"),
        answer_tokens=total("answer_tokens"),
        tool_calls=sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant"),
        finish_reason=events[-1]["finish_reason"] if events else None,
    )
