"""Write the bundled demo dataset, data/sample/, from templates: the same bytes on every run.

    python data/make_sample.py [--out data/sample]

Files (see docs for what each exercises):

* ``openai_chat.jsonl``: OpenAI form; system prompts, 1 to 4 user turns, some rows
  with an ``id``, some ending on a user turn (a prompt with no answer yet).
* ``tools.jsonl``: OpenAI form with ``tools`` (a list, or a JSON string of one):
  single calls, calls in sequence, parallel calls with several tool results, and
  turns that answer without calling.
* ``sharegpt.parquet``: ShareGPT form as Hugging Face ``datasets`` writes it (a
  ``conversations`` list-of-struct column), LLaMA-Factory ``system`` and ``tools``
  columns, some ``function_call``/``observation`` turns.
* ``bad_rows.jsonl``: one row of each kind of defect in BAD_ROWS, then one valid
  row that reuses an ``id`` of openai_chat.jsonl (a duplicate for the submitter).

Every good conversation is distinct, so the only duplicate is the planted one.
Stdlib and pyarrow only; the test suite regenerates the files and compares them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

#: Fixed so the files never change unless this script does.
SEED = 20240917
N_CHAT = 140
N_TOOLS = 55
N_SHAREGPT = 95
#: The id the planted duplicate in bad_rows.jsonl reuses (row 1 of openai_chat.jsonl).
DUPLICATED_ID = "chat-0000"

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in at most three sentences.",
    "You are a patient tutor who explains each step.",
    "You are a senior software engineer. Prefer short, idiomatic code.",
    "You are a friendly assistant for everyday questions around the house.",
    "Answer as plainly as you can; avoid jargon.",
]

EVERYDAY = [
    ("How do I get a {x} stain out of a cotton shirt?", ["coffee", "red wine", "grass", "ink", "tomato sauce"],
     "Blot the {x} stain (don't rub), rinse it from the back with cold water, work in a drop of dish soap, "
     "then wash as usual. Check it is gone before drying: heat sets stains."),
    ("How often should I water a {x}?", ["snake plant", "basil plant", "cactus", "fern", "peace lily"],
     "Water a {x} when the top few centimetres of soil are dry; push a finger in to check rather than "
     "following a fixed schedule, and make sure the pot drains."),
    ("What's a good way to keep {x} fresh for longer?", ["bread", "herbs", "avocados", "berries", "lettuce"],
     "Keep {x} away from heat and moisture swings: store them loosely wrapped, use the fridge where it "
     "suits them, and check daily so one spoiled piece does not spread."),
    ("Can you suggest a quick dinner with {x}?", ["chickpeas", "eggs", "rice", "spinach", "pasta"],
     "Try a 20-minute skillet: soften onion and garlic, add {x} with a tin of tomatoes and a pinch of "
     "cumin, simmer ten minutes, and finish with lemon and fresh herbs."),
    ("How do I fall asleep faster when I {x}?", ["drink coffee late", "work night shifts", "travel a lot"],
     "Keep a fixed wake-up time, dim screens an hour before bed, and if you are awake after twenty "
     "minutes, get up and read until sleepy. When you {x}, protect that routine first."),
    ("What should I pack for a {x} trip?", ["weekend hiking", "beach", "business", "winter city"],
     "For a {x} trip: layers you can combine, comfortable shoes, a refillable bottle, chargers, "
     "medication, and copies of your documents."),
]

CODING = [
    ("Write a Python function that {x}.", [
        ("reverses a string", "def reverse(s: str) -> str:\n    return s[::-1]"),
        ("checks whether a word is a palindrome",
         "def is_palindrome(word: str) -> bool:\n    w = word.lower()\n    return w == w[::-1]"),
        ("counts the vowels in a string",
         "def count_vowels(s: str) -> int:\n    return sum(ch in 'aeiou' for ch in s.lower())"),
        ("flattens a list of lists", "def flatten(rows):\n    return [x for row in rows for x in row]"),
        ("removes duplicates from a list but keeps the order",
         "def dedupe(items):\n    return list(dict.fromkeys(items))"),
        ("returns the n-th Fibonacci number",
         "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"),
    ], "Here is one way:\n\n```python\n{y}\n```\n\nIt runs in linear time and needs no imports."),
    ("What is the difference between {x} in {lang}?", [
        ("a list and a tuple", "lists are mutable and tuples are not, so tuples can be dict keys"),
        ("== and is", "== compares values while `is` checks that both names refer to the same object"),
        ("let and const", "const bindings cannot be reassigned, while let bindings can"),
        ("a process and a thread", "processes have separate memory while threads share their process's memory"),
    ], "In short, {y}. Pick the one whose guarantees match how the value is used."),
]
LANGUAGES = ["Python", "JavaScript", "everyday programming"]

FOLLOW_UPS = [
    ("Can you explain that more simply?", "Sure. In one line: {summary}"),
    ("Why does that work?", "Because each step keeps the part that matters: {summary}"),
    ("Thanks! Could you give me one more tip?", "One more: write the steps down once, so next time is quicker."),
    ("Is there anything I should avoid?", "Avoid rushing it: most mistakes come from skipping the check at the end."),
]

CITIES = ["Paris", "Tokyo", "Lima", "Nairobi", "Oslo", "Toronto", "Hanoi", "Madrid", "Sydney", "Cairo"]
CONDITIONS = ["sunny", "cloudy", "light rain", "windy", "clear", "overcast"]
CURRENCIES = [("USD", "EUR", 0.92), ("EUR", "JPY", 161.4), ("GBP", "USD", 1.27), ("CAD", "USD", 0.73)]
STOCKS = {"AAPL": 227.5, "MSFT": 415.3, "NVDA": 118.9, "TSLA": 244.1}
ZONES = {"Tokyo": "Asia/Tokyo", "London": "Europe/London", "New York": "America/New_York"}

TOOL_SPECS: dict[str, dict[str, Any]] = {
    "get_weather": {"name": "get_weather", "description": "Current weather for a city.",
                    "parameters": {"type": "object", "properties": {
                        "city": {"type": "string", "description": "City name"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                        "required": ["city"]}},
    "convert_currency": {"name": "convert_currency", "description": "Convert an amount between currencies.",
                         "parameters": {"type": "object", "properties": {
                             "amount": {"type": "number"}, "from_currency": {"type": "string"},
                             "to_currency": {"type": "string"}},
                             "required": ["amount", "from_currency", "to_currency"]}},
    "calculator": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                   "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                  "required": ["expression"]}},
    "get_time": {"name": "get_time", "description": "Current local time in an IANA time zone.",
                 "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                                "required": ["timezone"]}},
    "get_stock_price": {"name": "get_stock_price", "description": "Latest price of a stock ticker.",
                        "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}},
                                       "required": ["symbol"]}},
}


# ----------------------------------------------------------------------------- plain chat

def _math(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        return f"What is {a} × {b}?", f"{a} × {b} = {a * b}."
    if kind == 1:
        a, x, b = rng.randint(2, 9), rng.randint(-9, 12), rng.randint(1, 30)
        return (f"Solve for x: {a}x + {b} = {a * x + b}.",
                f"Subtract {b} from both sides to get {a}x = {a * x}, then divide by {a}: x = {x}.")
    if kind == 2:
        p, n = rng.choice([5, 10, 15, 20, 25, 40]), rng.randrange(20, 900, 20)
        return f"What is {p}% of {n}?", f"{p}% of {n} is {n} × {p}/100 = {n * p / 100:g}."
    if kind == 3:
        k, n = rng.randint(2, 9), rng.randint(2, 7)
        return f"What is the derivative of {k}x^{n}?", f"By the power rule, d/dx {k}x^{n} = {k * n}x^{n - 1}."
    c = rng.randrange(-20, 45)
    return (f"Convert {c} °C to Fahrenheit.",
            f"F = C × 9/5 + 32, so {c} °C is {c * 9 / 5 + 32:g} °F.")


def _question(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        q, fills, a = rng.choice(EVERYDAY)
        x = rng.choice(fills)
        return q.format(x=x), a.format(x=x)
    if kind == 1:
        q, pairs, a = rng.choice(CODING)
        x, y = rng.choice(pairs)
        return q.format(x=x, lang=rng.choice(LANGUAGES)), a.format(y=y)
    return _math(rng)


def _chat_turns(rng: random.Random) -> list[tuple[str, str]]:
    """(user, assistant) pairs: a first question, then follow-ups or new questions."""
    q, a = _question(rng)
    turns = [(q, a)]
    for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 3])):
        if rng.random() < 0.5:
            fq, fa = rng.choice(FOLLOW_UPS)
            turns.append((fq, fa.format(summary=turns[-1][1].split(". ")[0].rstrip(".") + ".")))
        else:
            turns.append(_question(rng))
    return turns


_SPEAKERS = {"human": "user", "gpt": "assistant", "observation": "tool", "function_call": "assistant"}


def _key(system: str, turns: list[dict[str, Any]]) -> str:
    """The roles and texts of a conversation in either form, so repeats are caught across files."""
    pairs = [("system", system)] if system else []
    for t in turns:
        pairs.append((t.get("role") or _SPEAKERS[t["from"]], t.get("content") or t.get("value") or ""))
    return json.dumps(pairs, ensure_ascii=False)


def _unique(rng: random.Random, seen: set[str], make: Any) -> Any:
    # Template combinations can repeat; a repeat without an id would hash to an
    # existing sample id and count as a duplicate the demo did not plant.
    while True:
        made = make(rng)
        key = _key(made[0], made[1])
        if key not in seen:
            seen.add(key)
            return made


def openai_chat_rows(rng: random.Random, seen: set[str]) -> list[dict[str, Any]]:
    def make(rng: random.Random) -> tuple[str, list[dict[str, Any]]]:
        messages: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for q, a in _chat_turns(rng):
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if rng.random() < 0.1:
            messages.pop()  # a prompt still waiting for its answer
        return "", messages

    rows = []
    for i in range(N_CHAT):
        _, messages = _unique(rng, seen, make)
        row: dict[str, Any] = {}
        if i == 0 or rng.random() < 0.5:
            row["id"] = f"chat-{i:04d}"
        row["messages"] = messages
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- tool use

def _weather(rng: random.Random, city: str) -> dict[str, Any]:
    return {"city": city, "temperature": rng.randint(-5, 34), "unit": "celsius", "condition": rng.choice(CONDITIONS)}


def _call(name: str, args: dict[str, Any], call_id: str, as_string: bool) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


def _tool_episode(rng: random.Random, n: int) -> tuple[list[dict[str, Any]], set[str]]:
    """One user request and the assistant/tool turns that answer it; also the tools it needs."""
    as_string = rng.random() < 0.7  # the OpenAI API sends arguments as a JSON string
    kind = rng.randrange(5)
    msgs: list[dict[str, Any]] = []
    if kind == 0:  # one call
        city = rng.choice(CITIES)
        w = _weather(rng, city)
        msgs.append({"role": "user", "content": f"What's the weather like in {city} right now?"})
        msgs.append({"role": "assistant", "content": None,
                     "tool_calls": [_call("get_weather", {"city": city, "unit": "celsius"}, f"call_{n}a", as_string)]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{n}a", "content": json.dumps(w)})
        msgs.append({"role": "assistant", "content": f"It is {w['temperature']} °C and {w['condition']} in {city}."})
        return msgs, {"get_weather"}
    if kind == 1:  # parallel calls, several results, one answer
        cities = rng.sample(CITIES, rng.choice([2, 3]))
        msgs.append({"role": "user", "content": f"Compare the weather in {', '.join(cities)}."})
        ids = [f"call_{n}{chr(97 + k)}" for k in range(len(cities))]
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            _call("get_weather", {"city": c}, cid, as_string) for c, cid in zip(cities, ids, strict=True)]})
        results = [_weather(rng, c) for c in cities]
        for cid, w in zip(ids, results, strict=True):
            msgs.append({"role": "tool", "tool_call_id": cid, "content": json.dumps(w)})
        warmest = max(results, key=lambda w: w["temperature"])
        msgs.append({"role": "assistant", "content": "; ".join(
            f"{w['city']}: {w['temperature']} °C, {w['condition']}" for w in results)
            + f". {warmest['city']} is the warmest."})
        return msgs, {"get_weather"}
    if kind == 2:  # two different tools in parallel
        place, symbol = rng.choice(list(ZONES)), rng.choice(list(STOCKS))
        hour = rng.randint(0, 23)
        msgs.append({"role": "user", "content": f"What time is it in {place}, and what is {symbol} trading at?"})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            _call("get_time", {"timezone": ZONES[place]}, f"call_{n}a", as_string),
            _call("get_stock_price", {"symbol": symbol}, f"call_{n}b", as_string)]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{n}a",
                     "content": json.dumps({"timezone": ZONES[place], "time": f"{hour:02d}:15"})})
        msgs.append({"role": "tool", "tool_call_id": f"call_{n}b",
                     "content": json.dumps({"symbol": symbol, "price": STOCKS[symbol]})})
        msgs.append({"role": "assistant",
                     "content": f"It is {hour:02d}:15 in {place}, and {symbol} is at ${STOCKS[symbol]}."})
        return msgs, {"get_time", "get_stock_price"}
    if kind == 3:  # calls in sequence: the second needs the first's result
        src, dst, rate = rng.choice(CURRENCIES)
        amount, pct = rng.randrange(50, 1000, 10), rng.choice([10, 15, 20])
        converted = round(amount * rate, 2)
        msgs.append({"role": "user", "content": f"Convert {amount} {src} to {dst}, then tell me {pct}% of that."})
        msgs.append({"role": "assistant", "content": "First the conversion.", "tool_calls": [_call(
            "convert_currency", {"amount": amount, "from_currency": src, "to_currency": dst}, f"call_{n}a", as_string)]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{n}a", "content": json.dumps({"result": converted})})
        expr = f"{converted} * {pct} / 100"
        msgs.append({"role": "assistant", "content": None,
                     "tool_calls": [_call("calculator", {"expression": expr}, f"call_{n}b", as_string)]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{n}b", "content": f"{converted * pct / 100:.2f}"})
        msgs.append({"role": "assistant", "content": f"{amount} {src} is {converted} {dst}; "
                                                     f"{pct}% of that is {converted * pct / 100:.2f} {dst}."})
        return msgs, {"convert_currency", "calculator"}
    q, a = _math(rng)  # tools offered, none needed
    msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs, {"calculator"}


def tools_rows(rng: random.Random, seen: set[str]) -> list[dict[str, Any]]:
    def make(rng: random.Random) -> tuple[str, list[dict[str, Any]], set[str]]:
        n = rng.randrange(10**6)
        messages: list[dict[str, Any]] = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": "You can call tools. Use them for live data."})
        names: set[str] = set()
        for _ in range(rng.choice([1, 1, 1, 2])):
            episode, used = _tool_episode(rng, n)
            messages += episode
            names |= used
            n += 1
        return "", messages, names

    rows = []
    for i in range(N_TOOLS):
        _, messages, names = _unique(rng, seen, make)
        names |= set(rng.sample(sorted(TOOL_SPECS), 1))  # an unused tool or two, as real rows have
        tools = [{"type": "function", "function": TOOL_SPECS[name]} for name in sorted(names)]
        row: dict[str, Any] = {}
        if rng.random() < 0.5:
            row["id"] = f"tools-{i:04d}"
        row["messages"] = messages
        # Hugging Face datasets often hold tools as a JSON string (one schema for every row).
        row["tools"] = json.dumps(tools) if rng.random() < 0.3 else tools
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- ShareGPT

def sharegpt_rows(rng: random.Random, seen: set[str]) -> list[dict[str, Any]]:
    def make(rng: random.Random) -> tuple[str, list[dict[str, Any]], str | None]:
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.4 else ""
        if rng.random() < 0.25:  # LLaMA-Factory tool use
            city = rng.choice(CITIES)
            w = _weather(rng, city)
            turns = [{"from": "human", "value": f"Is it {w['condition']} in {city} today?"},
                     {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": city}})},
                     {"from": "observation", "value": json.dumps(w)},
                     {"from": "gpt", "value": f"It is {w['condition']} and {w['temperature']} °C in {city}."}]
            tools = json.dumps([TOOL_SPECS["get_weather"], TOOL_SPECS["get_time"]])
            return system, turns, tools
        turns = []
        for q, a in _chat_turns(rng):
            turns += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
        return system, turns, None

    rows = []
    for i in range(N_SHAREGPT):
        system, turns, tools = _unique(rng, seen, make)
        rows.append({"id": f"sg-{i:04d}" if rng.random() < 0.5 else None,
                     "conversations": turns, "system": system, "tools": tools})
    return rows


SHAREGPT_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("conversations", pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))),
    ("system", pa.string()),
    ("tools", pa.string()),
])


# ----------------------------------------------------------------------------- bad rows

#: One line per defect, in file order, with the reason the producer gives it.
BAD_ROWS: list[tuple[str, bytes]] = [
    ("malformed_json", b'{"id": "bad-json", "messages": [{"role": "user", "content": "unterminated}'),
    ("invalid_utf8", b'{"id": "bad-utf8", "messages": [{"role": "user", "content": "caf\xe9 au lait?"}]}'),
    ("unknown_role", b'{"id": "bad-role", "messages": [{"role": "user", "content": "Hi"}, '
                     b'{"role": "narrator", "content": "The user waves."}]}'),
    ("no_user_turn", b'{"id": "bad-no-user", "messages": [{"role": "system", "content": "Be brief."}, '
                     b'{"role": "assistant", "content": "Hello!"}]}'),
    ("wrong_type", b'{"id": "bad-type", "messages": [{"role": "user", "content": 42}]}'),
    ("tool_without_call", b'{"id": "bad-tool", "messages": [{"role": "user", "content": "Weather?"}, '
                          b'{"role": "tool", "content": "{\\"temperature\\": 3}"}, '
                          b'{"role": "assistant", "content": "It is 3 degrees."}]}'),
    ("empty_conversation", b'{"id": "bad-empty", "messages": []}'),
    ("missing_field", b'{"id": "bad-missing", "prompt": "What is 2 + 2?", "response": "4"}'),
]

DUPLICATE_ROW = {"id": DUPLICATED_ID, "messages": [
    {"role": "user", "content": "This row reuses the id of another row."},
    {"role": "assistant", "content": "Then the submitter keeps the first and records this one as a duplicate."}]}


# ----------------------------------------------------------------------------- writing

def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_sample(out: Path) -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "openai_chat.jsonl", openai_chat_rows(rng, seen))
    _write_jsonl(out / "tools.jsonl", tools_rows(rng, seen))
    table = pa.Table.from_pylist(sharegpt_rows(rng, seen), schema=SHAREGPT_SCHEMA)
    # Small row groups so readers meet more than one, as they would in a real file.
    pq.write_table(table, out / "sharegpt.parquet", row_group_size=40, compression="zstd")
    bad = b"".join(line + b"\n" for _, line in BAD_ROWS)
    bad += json.dumps(DUPLICATE_ROW).encode() + b"\n"
    (out / "bad_rows.jsonl").write_bytes(bad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "sample")
    write_sample(parser.parse_args().out)


if __name__ == "__main__":
    main()
