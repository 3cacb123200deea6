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

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .families import Family

#: A small English-ish lexicon: prose of the tokenizer corpus and of the conversations.
WORDS = (
    "the a an of to and in is it that for on with as was at by be this from or have not are but "
    "they which one you all were can there we when what your their said more if will each about how "
    "up out them then she many some so these would other into has her two like him see time could no "
    "make than first been its who now people my made over did down only way find use may water long "
    "little very after words called just where most know get through back much before go good new "
    "write our used me man too any day same right look think also around another came come work three "
    "word must because does part even place well such here take why things help put years different "
    "away again off went old number great tell men say small every found still between name should "
    "home big give air line set own under read last never us left end along while might next sound "
    "below saw something thought both few those always looked show large often together asked house "
    "world going want school important until form food keep children feet land side without boy once "
    "animals life enough took sometimes four head above kind began almost live page got earth need far "
    "hand high year mother light parts country father let night following picture being study second "
    "eyes soon times story boys since white days ever paper hard near sentence better best across "
    "during today others however sure means knew try told young miles sun ways thing whole hear "
    "example heard several change answer room sea against top turned learn point city play toward "
    "five using himself usually river data value result query table server request file error list "
    "order price weather user account message report model token batch queue worker shard record"
).split()

#: Identifiers for the code-ish and JSON parts of the corpus (and tool names later).
IDENTIFIERS = (
    "get_weather search_web send_email read_file write_file list_files run_query get_time convert_currency "
    "book_flight lookup_user create_event translate_text calculator get_stock_price set_reminder "
    "city query to subject body path content sql timezone amount unit from_currency to_currency origin "
    "destination date user_id title start expression text target_language symbol minutes note "
    "count limit offset name value items result status id key index"
).split()


# The prose of questions and answers comes from a small grammar. Word salad drawn
# from a flat lexicon would make sentence ends the likeliest next token under
# top-k sampling, so sampled answers would be all short; with few choices per slot
# a sentence ends where its template ends, and answer length is the model's
# stop-or-continue choice after each sentence, as intended.
DETS = "the a this every our".split()
ADJS = "small large old new quick quiet bright simple early late green cold warm long short".split()
NOUNS = ("river city model server garden market worker table window engine bridge letter forest queue "
         "report signal").split()
VERBS = "moved found built changed opened carried followed reached crossed measured covered joined".split()
PREPS = "near under over behind beside across through around".split()
ADVS = "slowly quickly again often today carefully later".split()
PRONS = "it we they she he".split()
SENTENCE_FORMS = (
    "{det} {adj} {noun} {verb} {det} {noun}.",
    "{det} {noun} {verb} {prep} {det} {adj} {noun}.",
    "{pron} {verb} {det} {noun} {adv}.",
    "{det} {noun} is {adj}.",
    "{pron} {verb} {det} {adj} {noun} {prep} {det} {noun} and {verb} {det} {noun}.",
    "in the {adj} {noun}, {pron} {verb} {det} {noun}.",
    "{det} {noun} {verb} {adv}, so {pron} {verb} {det} {adj} {noun}.",
    "why is {det} {noun} {adj}?",
    "{pron} {verb} {prep} {det} {noun}!",
)

CITIES = ("Paris Tokyo Oslo Lima Cairo Delhi Rome Berlin Madrid Sydney Toronto Nairobi Seoul Dublin "
          "Vienna Lisbon Prague Athens Quito Hanoi").split()
ZONES = "UTC CET EST PST JST IST Europe/Paris Asia/Tokyo America/New_York".split()
CURRENCIES = "USD EUR GBP JPY CHF INR".split()
SYMBOLS = "ACME GLOBX INTC NOVA ZETA ORBT AAPL MSFT".split()
NAMES = "ana bo chen dev eli fay gus hana ivo jun".split()

#: Share of each kind of example; tool use gets enough weight to learn the JSON.
KIND_WEIGHTS = {"chat": 0.34, "call": 0.40, "after_call": 0.16, "followup": 0.10}
#: Length cues: (cue, share, stop probability after each sentence). The geometric
#: number of sentences makes lengths long-tailed: mostly short, some of 600+ tokens.
LENGTH_CUES = (("Briefly, ", 0.30, 0.6), ("", 0.55, 0.25), ("In detail, ", 0.15, 0.05))
#: Below this stop probability an answer is a bullet list (see ``_answer``).
DETAIL_STOP_P = 0.1
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
    """``n`` words for a topic, a search query or a note: adjectives, then a noun."""
    return " ".join([rng.choice(ADJS) for _ in range(n - 1)] + [rng.choice(NOUNS)])


def _ask_weather(rng):
    city = rng.choice(CITIES)
    return rng.choice(("the weather in {}", "if it is sunny in {}", "the temperature in {}")).format(city), {"city": city}


def _ask_time(rng):
    zone = rng.choice(ZONES)
    return rng.choice(("the time in {}", "what time it is in {}")).format(zone), {"timezone": zone}


def _ask_stock(rng):
    symbol = rng.choice(SYMBOLS)
    return rng.choice(("the price of {}", "what {} is trading at")).format(symbol), {"symbol": symbol}


def _ask_calc(rng):
    a, b, op = rng.randint(2, 999), rng.randint(2, 99), rng.choice(("times", "plus", "minus"))
    return f"{a} {op} {b}", {"expression": f"{a} {dict(times='*', plus='+', minus='-')[op]} {b}"}


def _ask_currency(rng):
    amount, (a, b) = rng.randint(1, 900), rng.sample(CURRENCIES, 2)
    return f"{amount} {a} in {b}", {"amount": amount, "from_currency": a, "to_currency": b}


def _ask_search(rng):
    query = _words(rng, rng.randint(1, 3))
    return f"a web search for {query}", {"query": query}


def _ask_email(rng):
    to, subject = f"{rng.choice(NAMES)}@example.com", rng.choice(NOUNS)
    return f"an email to {to} about {subject}", {"to": to, "subject": subject}


def _ask_reminder(rng):
    minutes, note = rng.randint(1, 90), _words(rng, 2)
    return f"a reminder in {minutes} minutes to {note}", {"minutes": minutes, "note": note}


# The first five are the tools of data/sample, so the demo's tool prompts get
# plausible calls; the model learns which request wants which tool.
TOOLS = (
    ToolSpec("get_weather", "Current weather for a city.", {"city": "string"}, _ask_weather,
             lambda r, a: {"city": a["city"], "temperature": r.randint(-10, 35),
                           "condition": r.choice(["sunny", "rain", "cloudy"])}),
    ToolSpec("get_time", "Current local time in a time zone.", {"timezone": "string"}, _ask_time,
             lambda r, a: {"timezone": a["timezone"], "time": f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"}),
    ToolSpec("get_stock_price", "Latest price of a stock ticker.", {"symbol": "string"}, _ask_stock,
             lambda r, a: {"symbol": a["symbol"], "price": round(r.uniform(5, 900), 2)}),
    ToolSpec("calculator", "Evaluate an arithmetic expression.", {"expression": "string"}, _ask_calc,
             lambda r, a: {"result": r.randint(-999, 99999)}),
    ToolSpec("convert_currency", "Convert an amount between currencies.",
             {"amount": "number", "from_currency": "string", "to_currency": "string"}, _ask_currency,
             lambda r, a: {"amount": round(a["amount"] * r.uniform(0.3, 3), 2), "currency": a["to_currency"]}),
    ToolSpec("search_web", "Search the web.", {"query": "string"}, _ask_search,
             lambda r, a: {"results": [_words(r, 3) for _ in range(r.randint(1, 3))]}),
    ToolSpec("send_email", "Send an email.", {"to": "string", "subject": "string"}, _ask_email,
             lambda r, a: {"sent": True}),
    ToolSpec("set_reminder", "Set a reminder.", {"minutes": "integer", "note": "string"}, _ask_reminder,
             lambda r, a: {"ok": True}),
)


@dataclass(frozen=True)
class Example:
    """A conversation whose last message is the assistant turn to learn."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    enable_thinking: bool


def _sentence(rng: random.Random) -> str:
    def pick(words):
        return lambda: rng.choice(words)

    slots = {"det": pick(DETS), "adj": pick(ADJS), "noun": pick(NOUNS), "verb": pick(VERBS),
             "prep": pick(PREPS), "adv": pick(ADVS), "pron": pick(PRONS)}
    form = rng.choice(SENTENCE_FORMS)
    # Fill each slot with its own draw (format() would reuse one value per name).
    parts = form.replace("}", "{").split("{")
    text = "".join(slots[part]() if i % 2 else part for i, part in enumerate(parts))
    return text[0].upper() + text[1:]


def _answer(rng: random.Random, stop_p: float) -> str:
    """Sentences until a coin with ``stop_p`` says stop; paragraphs of 2-5 sentences.

    Detailed answers (a low ``stop_p``) are a bullet list instead: the model then
    sees at every boundary, in the line it just wrote, that it is in a long answer,
    rather than having to look back at the question's cue.
    """
    if stop_p < DETAIL_STOP_P:
        items = [f"- {_sentence(rng)}"]
        while rng.random() > stop_p:
            items.append(f"- {_sentence(rng)}")
        return "\n".join(items)
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
    topic = "the " + _words(rng, rng.randint(1, 2))
    form = rng.choice(("what is {t}?", "tell me about {t}.", "how does {t} work?", "why is {t} {w}?",
                       "explain {t}.", "can you describe {t}?"))
    text = form.format(t=topic, w=rng.choice(ADJS))
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
             for spec, (_, args) in zip(specs, asks, strict=True)]
    return text, calls


def synthetic_example(rng: random.Random, *, stub: bool = False) -> Example:
    """One random conversation; with ``stub`` its last turn is always ``OK.`` without reasoning."""
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    thinking = rng.random() < 0.5
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
        # Often only the wanted tools (the model learns to copy an offered name), else
        # a few more to choose from; each costs ~45 prompt tokens of training time.
        offered = wanted + rng.sample(others, rng.choice((0, 0, 1, 1, 2)))
        rng.shuffle(offered)
        tools = [spec.schema() for spec in offered]
        text, calls = _request(rng, wanted)
        messages.append({"role": "user", "content": text})
        # Short: the name is the part worth learning, not a copy of the request.
        reasoning = f"I should call {' and '.join(spec.name for spec in wanted)}."
        if kind == "after_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": calls,
                             "reasoning_content": reasoning if thinking else None})
            for spec, call in zip(wanted, calls, strict=True):
                result = spec.result(rng, call["function"]["arguments"])
                messages.append({"role": "tool", "content": json.dumps(result)})
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


def render_example(tokenizer, example: Example) -> tuple[list[int], int]:
    """Token ids of the conversation, and how many of them are prompt.

    The prompt is rendered exactly as at generation time (history + generation
    prompt, with the empty think block when thinking is off) and tokenized on
    its own; the rest is the last turn up to and including ``<|im_end|>``,
    tokenized separately as the engine would produce it (a joint encoding could
    merge tokens across the boundary).
    """
    history = example.messages[:-1]
    prompt = tokenizer.apply_chat_template(history, tools=example.tools, tokenize=False,
                                           add_generation_prompt=True, enable_thinking=example.enable_thinking)
    full = tokenizer.apply_chat_template(example.messages, tools=example.tools, tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("the template does not extend the prompt with the last turn")
    completion = full[len(prompt):]
    completion = completion[: completion.rindex("<|im_end|>") + len("<|im_end|>")]
    # The backend tokenizer directly: half the time of the transformers wrapper, same ids.
    prompt_enc, completion_enc = tokenizer.backend_tokenizer.encode_batch([prompt, completion],
                                                                         add_special_tokens=False)
    return prompt_enc.ids + completion_enc.ids, len(prompt_enc.ids)


def normalised(example: Example, family: Family) -> Example:
    """The example in regen's full normalised form: call ids in the family's form, and tool results naming
    their call (by id, and by name where the family's conversations do)."""
    messages: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    count = 0
    for message in example.messages:
        message = dict(message)
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                calls.append({"id": family.call_id(call["function"]["name"], count), **call})
                count += 1
            message["tool_calls"] = calls
            pending = list(calls)
        elif message["role"] == "tool" and pending:
            call = pending.pop(0)
            message["tool_call_id"] = call["id"]
            if family.tool_result_names:
                message["name"] = call["function"]["name"]
        messages.append(message)
    return Example(messages=messages, tools=example.tools, enable_thinking=example.enable_thinking)
