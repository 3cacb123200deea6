"""Synthetic conversations that teach the tiny model Qwen3's output format.

The content is word salad on purpose: the model only has to learn the *shape*
of a Qwen3 turn (think block, answer, tool calls, end of turn) and answer
lengths with a long tail. Every example is a full conversation in regen's
normalised form, whose last message is the assistant turn to learn.

Kinds of example, and what the last turn teaches:

* chat: reasoning (thinking on) or none (off), then an answer whose length
  depends on a cue in the question ("Briefly," / "In detail,").
* call: tools are offered, the user asks for one or two of them; the turn is one
  or two ``<tool_call>`` blocks naming offered tools with JSON arguments.
* after_call: the same after the tool responses; the turn is a short answer.
* followup: a second question after an earlier exchange.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .tiny_model import WORDS

CITIES = ("Paris Tokyo Oslo Lima Cairo Delhi Rome Berlin Madrid Sydney Toronto Nairobi Seoul Dublin "
          "Vienna Lisbon Prague Athens Quito Hanoi").split()
ZONES = "UTC CET EST PST JST IST".split()
UNITS = ("km", "mi", "kg", "lb", "m", "ft")
SYMBOLS = "ACME GLOBX INTC NOVA ZETA ORBT".split()
NAMES = "ana bo chen dev eli fay gus hana ivo jun".split()

#: Share of each kind of example; tool use gets enough weight to learn the JSON.
KIND_WEIGHTS = {"chat": 0.40, "call": 0.30, "after_call": 0.18, "followup": 0.12}
#: Length cues: (cue, share, stop probability after each sentence). The geometric
#: number of sentences makes lengths long-tailed: mostly short, some of 600+ tokens.
LENGTH_CUES = (("Briefly, ", 0.30, 0.6), ("", 0.55, 0.25), ("In detail, ", 0.15, 0.045))
SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are a concise assistant.", "Answer the user.")


@dataclass(frozen=True)
class ToolSpec:
    """One fake tool: its schema, how a user asks for it, and what it returns."""

    name: str
    description: str
    params: dict[str, str]
    #: rng -> (request phrase, arguments)
    ask: Callable[[random.Random], tuple[str, dict[str, Any]]]
    #: (rng, arguments) -> result object
    result: Callable[[random.Random, dict[str, Any]], dict[str, Any]]

    def schema(self) -> dict[str, Any]:
        props = {key: {"type": kind} for key, kind in self.params.items()}
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": props, "required": list(self.params)}}}


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _ask_weather(rng):
    city = rng.choice(CITIES)
    return f"the weather in {city}", {"city": city}


def _ask_time(rng):
    zone = rng.choice(ZONES)
    return f"the time in {zone}", {"timezone": zone}


def _ask_search(rng):
    query = _words(rng, rng.randint(1, 3))
    return f"a web search for {query}", {"query": query}


def _ask_email(rng):
    to, subject = f"{rng.choice(NAMES)}@example.com", rng.choice(WORDS)
    return f"an email to {to} about {subject}", {"to": to, "subject": subject}


def _ask_convert(rng):
    amount, (a, b) = rng.randint(1, 500), rng.sample(UNITS, 2)
    return f"{amount} {a} in {b}", {"amount": amount, "from_unit": a, "to_unit": b}


def _ask_stock(rng):
    symbol = rng.choice(SYMBOLS)
    return f"the price of {symbol}", {"symbol": symbol}


def _ask_calc(rng):
    a, b = rng.randint(2, 999), rng.randint(2, 99)
    return f"{a} times {b}", {"expression": f"{a} * {b}"}


def _ask_reminder(rng):
    minutes, note = rng.randint(1, 90), _words(rng, 2)
    return f"a reminder in {minutes} minutes to {note}", {"minutes": minutes, "note": note}


TOOLS = (
    ToolSpec("get_weather", "Current weather for a city", {"city": "string"}, _ask_weather,
             lambda r, a: {"city": a["city"], "temp_c": r.randint(-10, 35), "sky": r.choice(["clear", "rain"])}),
    ToolSpec("get_time", "Local time in a timezone", {"timezone": "string"}, _ask_time,
             lambda r, a: {"time": f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"}),
    ToolSpec("search_web", "Search the web", {"query": "string"}, _ask_search,
             lambda r, a: {"results": [_words(r, 3) for _ in range(r.randint(1, 3))]}),
    ToolSpec("send_email", "Send an email", {"to": "string", "subject": "string"}, _ask_email,
             lambda r, a: {"sent": True}),
    ToolSpec("convert_units", "Convert an amount between units",
             {"amount": "number", "from_unit": "string", "to_unit": "string"}, _ask_convert,
             lambda r, a: {"value": round(a["amount"] * r.uniform(0.3, 3), 2)}),
    ToolSpec("get_stock_price", "Latest price of a stock", {"symbol": "string"}, _ask_stock,
             lambda r, a: {"symbol": a["symbol"], "price": round(r.uniform(5, 900), 2)}),
    ToolSpec("calculate", "Evaluate an arithmetic expression", {"expression": "string"}, _ask_calc,
             lambda r, a: {"result": eval(a["expression"], {"__builtins__": {}})}),  # noqa: S307 (our own digits)
    ToolSpec("set_reminder", "Set a reminder", {"minutes": "integer", "note": "string"}, _ask_reminder,
             lambda r, a: {"ok": True}),
)


@dataclass(frozen=True)
class Example:
    """A conversation whose last message is the assistant turn to learn."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    enable_thinking: bool


def _sentence(rng: random.Random) -> str:
    return _words(rng, rng.randint(4, 12)).capitalize() + rng.choice(("." * 6) + "!?")


def _answer(rng: random.Random, stop_p: float) -> str:
    """Sentences until a coin with ``stop_p`` says stop; paragraphs of 2-5 sentences."""
    paragraphs, current = [], [_sentence(rng)]
    while rng.random() > stop_p:
        if len(current) >= rng.randint(2, 5):
            paragraphs.append(" ".join(current))
            current = []
        current.append(_sentence(rng))
    paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def _question(rng: random.Random) -> tuple[str, str, float]:
    """A user question with a length cue; returns (question, topic, stop probability)."""
    cue, _, stop_p = rng.choices(LENGTH_CUES, weights=[c[1] for c in LENGTH_CUES])[0]
    topic = _words(rng, rng.randint(1, 3))
    form = rng.choice(("what is {t}?", "tell me about {t}.", "how does {t} work?", "why is {t} {w}?",
                       "explain {t}.", "can you describe {t}?"))
    text = form.format(t=topic, w=rng.choice(WORDS))
    return (cue + text) if cue else text.capitalize(), topic, stop_p


def _chat_reasoning(rng: random.Random, topic: str, stop_p: float) -> str:
    plan = "I will answer briefly." if stop_p > 0.5 else (
        "I will explain in detail." if stop_p < 0.1 else "I will answer.")
    extra = " ".join(_sentence(rng) for _ in range(rng.randint(0, 2)))
    return f"The user asks about {topic}. {extra} {plan}".replace("  ", " ")


def _request(rng: random.Random, specs: list[ToolSpec]) -> tuple[str, list[dict[str, Any]]]:
    """A user turn asking for one or two tools, and the calls that answer it."""
    asks = [spec.ask(rng) for spec in specs]
    lead = rng.choice(("Please get", "Can you find", "I need", "Check", "Look up"))
    text = f"{lead} {' and '.join(phrase for phrase, _ in asks)}{rng.choice('.?')}"
    calls = [{"type": "function", "function": {"name": spec.name, "arguments": args}}
             for spec, (_, args) in zip(specs, asks)]
    return text, calls


def synthetic_example(rng: random.Random, *, stub: bool = False) -> Example:
    """One random conversation; with ``stub`` its last turn is always ``OK.`` without reasoning."""
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    thinking = rng.random() < 0.6
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    tools = None
    reasoning, content, calls = "", "", None

    if kind in ("chat", "followup"):
        if kind == "followup":
            first, _, _ = _question(rng)
            messages += [{"role": "user", "content": first},
                         {"role": "assistant", "content": _answer(rng, 0.5), "reasoning_content": _sentence(rng)}]
        question, topic, stop_p = _question(rng)
        messages.append({"role": "user", "content": question})
        reasoning, content = _chat_reasoning(rng, topic, stop_p), _answer(rng, stop_p)
    else:
        wanted = rng.sample(TOOLS, 2 if rng.random() < 0.25 else 1)
        others = [t for t in TOOLS if t not in wanted]
        offered = wanted + rng.sample(others, rng.randint(0, 2))
        rng.shuffle(offered)
        tools = [spec.schema() for spec in offered]
        text, calls = _request(rng, wanted)
        messages.append({"role": "user", "content": text})
        names = " and ".join(spec.name for spec in wanted)
        reasoning = f"The user wants {text[0].lower()}{text[1:-1]}. I should call {names}."
        if kind == "after_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": calls,
                             "reasoning_content": reasoning if thinking else None})
            for spec, call in zip(wanted, calls):
                result = spec.result(rng, call["function"]["arguments"])
                messages.append({"role": "tool", "content": _json(result)})
            reasoning = "The tool returned a result. I will answer."
            content, calls = f"Here is what I found. {_answer(rng, 0.5)}", None

    if stub:
        reasoning, content, calls = "", "OK.", None
    last: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking and reasoning:
        last["reasoning_content"] = reasoning
    if calls:
        last["tool_calls"] = calls
    messages.append(last)
    return Example(messages=messages, tools=tools, enable_thinking=thinking)


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def render_example(tokenizer, example: Example) -> tuple[list[int], int]:
    """Token ids of the conversation, and how many of them are prompt.

    The prompt is rendered exactly as at generation time (history + generation
    prompt, with the empty think block when thinking is off); the rest is the
    last turn up to and including ``<|im_end|>``, tokenized on its own as the
    engine would produce it.
    """
    history = example.messages[:-1]
    prompt = tokenizer.apply_chat_template(history, tools=example.tools, tokenize=False,
                                           add_generation_prompt=True, enable_thinking=example.enable_thinking)
    full = tokenizer.apply_chat_template(example.messages, tools=example.tools, tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("the template does not extend the prompt with the last turn")
    completion = full[len(prompt):]
    completion = completion[: completion.rindex("<|im_end|>") + len("<|im_end|>")]
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    return prompt_ids + tokenizer.encode(completion, add_special_tokens=False), len(prompt_ids)
