"""Row normalisation (OpenAI and ShareGPT forms), reason codes, sample ids, and the demo dataset."""

from __future__ import annotations

import collections
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ledger.errors import InputRowError
from producer.dataset import normalize, reasons
from producer.dataset.normalize import content_hash_id, normalize_row
from producer.dataset.readers import iter_rows

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample"

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "What's the weather in Paris?"}
ANSWER = {"role": "assistant", "content": "Sunny."}
WEATHER = {"name": "get_weather", "description": "Weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def call(name="get_weather", arguments='{"city": "Paris"}', call_id=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id:
        c["id"] = call_id
    return c


def rejected(obj) -> InputRowError:
    with pytest.raises(InputRowError) as info:
        normalize_row(obj)
    assert len(info.value.detail) < 300
    return info.value


# --- OpenAI form ---------------------------------------------------------------------------


def test_a_plain_openai_row_keeps_its_messages_and_id():
    out = normalize_row({"id": "r1", "messages": [SYSTEM, USER, ANSWER], "extra": 1})
    assert out == {"sample_id": "r1", "messages": [SYSTEM, USER, ANSWER], "tools": None}


def test_an_integer_id_becomes_a_string():
    assert normalize_row({"id": 17, "messages": [USER]})["sample_id"] == "17"


def test_text_parts_are_joined_with_newlines_as_vllm_joins_them():
    msg = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert normalize_row({"messages": [msg]})["messages"] == [{"role": "user", "content": "a\nb"}]


def test_an_image_part_is_unsupported_content():
    msg = {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                       {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
    err = rejected({"messages": [msg]})
    assert (err.reason, err.detail.split(" ")[0]) == ("unsupported_content", "messages[0].content[1]")


def test_tool_call_arguments_become_objects_whether_given_as_string_or_object():
    row = {"messages": [USER,
                        {"role": "assistant", "content": None,
                         "tool_calls": [call(call_id="c1"), call(arguments={"city": "Oslo"}), call(arguments="")]},
                        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
                        {"role": "tool", "content": "rain"}, {"role": "tool", "content": "snow"}, ANSWER]}
    out = normalize_row(row)["messages"]
    assert out[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}, "id": "c1"},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {}}}]}
    assert out[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


def test_a_flattened_tool_call_is_accepted():
    row = {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris"}}]}]}
    assert normalize_row(row)["messages"][1]["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]


@pytest.mark.parametrize("arguments", ['{"city": ', "[1, 2]", '"Paris"', 42])
def test_arguments_that_are_not_a_json_object_are_invalid_tool_arguments(arguments):
    row = {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [call(arguments=arguments)]}]}
    err = rejected(row)
    assert err.reason == "invalid_tool_arguments"
    assert err.detail.startswith("messages[1].tool_calls[0].function.arguments")


def test_reasoning_content_is_kept_on_assistant_turns_and_null_optional_keys_are_dropped():
    # As a Parquet struct column delivers it: every field present, unused ones null.
    parquet_like = [{"role": "user", "content": "q", "tool_calls": None, "reasoning_content": None,
                     "name": None, "tool_call_id": None},
                    {"role": "assistant", "content": "a", "tool_calls": [], "reasoning_content": "think",
                     "name": "", "tool_call_id": None}]
    out = normalize_row({"messages": parquet_like})["messages"]
    assert out == [{"role": "user", "content": "q"},
                   {"role": "assistant", "content": "a", "reasoning_content": "think"}]


def test_developer_is_taken_as_system_and_a_late_system_message_is_kept_in_place():
    row = {"messages": [{"role": "developer", "content": "d"}, USER, ANSWER, SYSTEM, USER]}
    assert [m["role"] for m in normalize_row(row)["messages"]] == ["system", "user", "assistant", "system", "user"]


def test_a_top_level_system_field_becomes_the_first_message():
    out = normalize_row({"messages": [USER], "system": "Be brief."})
    assert out["messages"] == [SYSTEM, USER]
    assert normalize_row({"messages": [USER], "system": ""})["messages"] == [USER]


def test_messages_win_when_a_row_has_both_forms():
    out = normalize_row({"messages": [USER], "conversations": [{"from": "human", "value": "other"}]})
    assert out["messages"] == [USER]


def test_parallel_tool_results_may_follow_one_call_turn():
    row = {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [call(), call()]},
                        {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}, ANSWER]}
    assert len(normalize_row(row)["messages"]) == 5


# --- tools -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tools", [
    [{"type": "function", "function": WEATHER}],
    json.dumps([{"type": "function", "function": WEATHER}]),
    [WEATHER],  # bare specs, as LLaMA-Factory datasets write them
    json.dumps([WEATHER]),
    [json.dumps(WEATHER)],  # a list<string> column
])
def test_tools_in_any_accepted_shape_normalise_to_the_same_list(tools):
    assert normalize_row({"messages": [USER], "tools": tools})["tools"] == [{"type": "function", "function": WEATHER}]


@pytest.mark.parametrize("tools", [None, "", "  ", "[]", "null", []])
def test_no_tools_in_any_shape_normalise_to_none(tools):
    assert normalize_row({"messages": [USER], "tools": tools})["tools"] is None


def test_nulls_inside_tool_parameters_are_dropped():
    # Parquet stores the union of every row's properties and fills the others with null.
    spec = {"name": "f", "description": None, "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "enum": None}, "b": None}}}
    assert normalize_row({"messages": [USER], "tools": [spec]})["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string"}}}}}]


@pytest.mark.parametrize(("tools", "reason", "start"), [
    ("[{", "invalid_tools", "tools is not valid JSON"),
    ([{"description": "no name"}], "invalid_tools", "tools[0] has no function name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "{bad"}}], "invalid_tools", "tools[0].function"),
    ([3], "invalid_tools", "tools[0] is an integer"),
    ({"name": "f"}, "wrong_type", "tools is an object"),
    (5, "wrong_type", "tools is an integer"),
    ([{"type": "code_interpreter"}], "unsupported_content", "tools[0].type"),
])
def test_bad_tools_are_rejected_naming_the_tool(tools, reason, start):
    err = rejected({"messages": [USER], "tools": tools})
    assert (err.reason, err.detail[:len(start)]) == (reason, start)


# --- ShareGPT form ---------------------------------------------------------------------------


def test_sharegpt_roles_map_to_openai_roles():
    row = {"id": "s1", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "q"},
                                         {"from": "gpt", "value": "a"}]}
    assert normalize_row(row)["messages"] == [SYSTEM, {"role": "user", "content": "q"},
                                              {"role": "assistant", "content": "a"}]


def test_sharegpt_function_call_and_observation_become_a_tool_call_and_its_result():
    row = {"conversations": [
        {"from": "human", "value": "weather?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"from": "observation", "value": "sunny"},
        {"from": "function_call", "value": json.dumps([{"name": "a", "arguments": "{}"}, {"name": "b"}])},
        {"from": "observation", "value": "1"}, {"from": "observation", "value": "2"},
        {"from": "gpt", "value": "done"}], "system": "Be brief.", "tools": json.dumps([WEATHER])}
    out = normalize_row(row)
    assert out["messages"][:4] == [
        SYSTEM, {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"}]
    assert [c["function"] for c in out["messages"][4]["tool_calls"]] == [
        {"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]
    assert out["tools"] == [{"type": "function", "function": WEATHER}]


def test_a_conversations_column_of_openai_turns_is_accepted():
    assert normalize_row({"conversations": [USER, ANSWER]})["messages"] == [USER, ANSWER]


@pytest.mark.parametrize(("turn", "reason", "start"), [
    ({"from": "bot", "value": "x"}, "unknown_role", "conversations[1].from is 'bot'"),
    ({"value": "x"}, "missing_field", "conversations[1].from"),
    ({"from": 3, "value": "x"}, "wrong_type", "conversations[1].from is an integer"),
    ({"from": "human", "value": None}, "missing_field", "conversations[1].value"),
    ({"from": "human", "value": ["x"]}, "wrong_type", "conversations[1].value is a list"),
    ({"from": "function_call", "value": "{not json"}, "invalid_tool_arguments", "conversations[1].value"),
    ({"from": "function_call", "value": "[]"}, "invalid_tool_arguments", "conversations[1].value"),
    ({"from": "function_call", "value": '"text"'}, "invalid_tool_arguments", "conversations[1].value[0]"),
    ("just text", "wrong_type", "conversations[1] is a string"),
])
def test_bad_sharegpt_turns_are_rejected_naming_the_turn(turn, reason, start):
    err = rejected({"conversations": [{"from": "human", "value": "q"}, turn]})
    assert (err.reason, err.detail[:len(start)]) == (reason, start)


# --- every reason the normaliser gives -------------------------------------------------------

BAD_ROWS = [
    ("missing_field", {"prompt": "hi"}, "row has neither"),
    ("missing_field", {"messages": None, "conversations": None}, "row has neither"),
    ("missing_field", {"messages": [{"content": "x"}]}, "messages[0].role"),
    ("missing_field", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("wrong_type", {"messages": "hi"}, "messages is a string"),
    ("wrong_type", {"conversations": {"from": "human"}}, "conversations is an object"),
    ("wrong_type", {"messages": [USER, 5]}, "messages[1] is an integer"),
    ("wrong_type", {"messages": [{"role": 1, "content": "x"}]}, "messages[0].role is an integer"),
    ("wrong_type", {"messages": [{"role": "user", "content": 42}]}, "messages[0].content is an integer"),
    ("wrong_type", {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages[0].content[0].text"),
    ("wrong_type", {"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0] is a string"),
    ("wrong_type", {"messages": [{"role": "user", "content": "x", "name": 3}]}, "messages[0].name"),
    ("wrong_type", {"messages": [USER, {"role": "assistant", "content": "x", "reasoning_content": ["a"]}]},
     "messages[1].reasoning_content"),
    ("wrong_type", {"messages": [{"role": "user", "content": "x", "tool_calls": [call()]}]},
     "messages[0].tool_calls on a user turn"),
    ("wrong_type", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": call()}]},
     "messages[1].tool_calls is an object"),
    ("wrong_type", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": 5}}]}]}, "messages[1].tool_calls[0].function.name"),
    ("missing_field", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"arguments": "{}"}}]}]}, "messages[1].tool_calls[0].function.name"),
    ("unsupported_content", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "custom", "custom": {}}]}]}, "messages[1].tool_calls[0].type"),
    ("wrong_type", {"messages": [USER], "id": 1.5}, "id is a number"),
    ("wrong_type", {"messages": [USER], "id": True}, "id is a boolean"),
    ("wrong_type", {"messages": [USER], "system": 1}, "system is an integer"),
    ("empty_conversation", {"messages": []}, "messages is an empty list"),
    ("empty_conversation", {"conversations": []}, "conversations is an empty list"),
    ("unknown_role", {"messages": [USER, {"role": "narrator", "content": "x"}]}, "messages[1].role is 'narrator'"),
    ("no_user_turn", {"messages": [SYSTEM, ANSWER]}, "messages has no user turn"),
    ("tool_without_call", {"messages": [{"role": "tool", "content": "x"}, USER]}, "messages[0] is a tool result"),
    ("tool_without_call", {"messages": [USER, ANSWER, {"role": "tool", "content": "x"}]}, "messages[2]"),
    ("tool_without_call", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [call()]},
                                        USER, {"role": "tool", "content": "x"}]}, "messages[3]"),
    ("id_too_long", {"messages": [USER], "id": "x" * 257}, "id has 257 characters"),
    ("invalid_id", {"messages": [USER], "id": "a\x00b"}, "id 'a\\x00b' holds a NUL character"),
    ("invalid_tool_arguments", {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        call(arguments={"x": [float("inf")]})]}]}, "messages[1].tool_calls[0].function.arguments.x[0] is inf"),
    ("invalid_tools", {"messages": [USER], "tools": [{"name": "f", "parameters": {"enum": [b"x"]}}]},
     "tools[0].function.parameters.enum[0] is a bytes value"),
    ("too_large", {"messages": [USER, ANSWER] * 501}, "messages has 1002 turns"),
    ("too_large", {"messages": [{"role": "user", "content": "x" * 2_000_001}]}, "messages holds 2000001"),
    ("not_an_object", ["not", "a", "dict"], "row is a list"),
]


@pytest.mark.parametrize(("reason", "row", "start"), BAD_ROWS, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(BAD_ROWS)])
def test_each_bad_row_is_rejected_with_its_reason_and_a_short_detail_naming_the_field(reason, row, start):
    err = rejected(row)
    assert err.reason == reason
    assert err.detail.startswith(start), err.detail


def test_every_reason_code_is_documented_and_tested():
    tested = {r for r, _, _ in BAD_ROWS} | {"invalid_tool_arguments", "invalid_tools"}
    given_by_readers = {"unreadable_file", "invalid_utf8", "malformed_json", "not_an_object", "too_large"}
    assert tested | given_by_readers | {"duplicate_id"} == set(reasons.REASONS)
    assert all(code.isidentifier() and code.islower() for code in reasons.REASONS)


def test_an_id_of_exactly_the_limit_is_kept():
    assert normalize_row({"messages": [USER], "id": "x" * normalize.MAX_ID_CHARS})["sample_id"] == "x" * 256


def test_a_huge_row_detail_never_dumps_the_row():
    err = rejected({"messages": [USER, {"role": "x" * 10_000, "content": "y" * 10_000}]})
    assert err.reason == "unknown_role" and len(err.detail) < 300


# --- sample ids ------------------------------------------------------------------------------


def test_a_row_without_id_gets_the_documented_content_hash():
    out = normalize_row({"messages": [USER, ANSWER], "tools": [WEATHER]})
    canonical = json.dumps({"messages": out["messages"], "tools": out["tools"]}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    assert out["sample_id"] == "h" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert out["sample_id"] == content_hash_id(out["messages"], out["tools"])


def test_an_empty_id_counts_as_no_id():
    assert normalize_row({"messages": [USER], "id": ""})["sample_id"].startswith("h")


def test_the_same_conversation_gets_the_same_id_in_either_form():
    openai = {"messages": [SYSTEM, USER, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}],
        "tools": [{"type": "function", "function": WEATHER}]}
    sharegpt = {"system": "Be brief.", "tools": json.dumps([WEATHER]), "conversations": [
        {"from": "human", "value": USER["content"]},
        {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
        {"from": "observation", "value": "sunny"}, {"from": "gpt", "value": "Sunny."}]}
    assert normalize_row(openai)["sample_id"] == normalize_row(sharegpt)["sample_id"]


def test_ids_do_not_depend_on_key_order_and_differ_for_different_content():
    a = normalize_row({"messages": [{"content": "q", "role": "user"}]})["sample_id"]
    b = normalize_row({"messages": [{"role": "user", "content": "q"}]})["sample_id"]
    c = normalize_row({"messages": [{"role": "user", "content": "q "}]})["sample_id"]
    assert a == b != c and len(a) == 33


def test_ids_are_the_same_whatever_the_file_type_and_file_order(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, ANSWER]} for i in range(5)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    schema = pa.schema([("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()),
                                                         ("tool_calls", pa.string())])))])
    pq.write_table(pa.Table.from_pylist(rows[::-1], schema=schema), tmp_path / "b.parquet")

    def ids(paths):
        return [normalize_row(r.obj)["sample_id"] for r in iter_rows(paths)]

    forward, backward = ids([tmp_path / "a.jsonl", tmp_path / "b.parquet"]), ids([tmp_path / "b.parquet", tmp_path / "a.jsonl"])
    assert forward == backward
    assert forward[:5] == forward[5:][::-1]


# --- the demo dataset ------------------------------------------------------------------------


def read_sample(folder: Path):
    good, bad = [], collections.Counter()
    for raw in iter_rows([folder]):
        if raw.error is not None:
            bad[raw.error.reason] += 1
            continue
        try:
            good.append((Path(raw.file).name, normalize_row(raw.obj)))
        except InputRowError as e:
            bad[e.reason] += 1
    return good, bad


def test_the_demo_dataset_has_the_documented_good_bad_and_duplicate_rows():
    good, bad = read_sample(SAMPLE)
    per_file = collections.Counter(name for name, _ in good)
    assert per_file == {"openai_chat.jsonl": 140, "tools.jsonl": 55, "sharegpt.parquet": 95, "bad_rows.jsonl": 1}
    assert bad == {"malformed_json": 1, "invalid_utf8": 1, "unknown_role": 1, "no_user_turn": 1,
                   "wrong_type": 1, "tool_without_call": 1, "empty_conversation": 1, "missing_field": 1}
    ids = collections.Counter(s["sample_id"] for _, s in good)
    assert {i: n for i, n in ids.items() if n > 1} == {"chat-0000": 2}


def test_the_demo_dataset_covers_the_shapes_it_promises():
    good, _ = read_sample(SAMPLE)
    samples = [s for _, s in good]
    tool_turns = [m for s in samples for m in s["messages"] if m.get("tool_calls")]
    assert any(len(m["tool_calls"]) >= 2 for m in tool_turns)  # parallel calls
    assert any(sum(1 for m in s["messages"] if m.get("tool_calls")) >= 2 for s in samples)  # calls in sequence
    assert max(sum(m["role"] == "user" for m in s["messages"]) for s in samples) == 4
    assert any(s["sample_id"].startswith("h") for s in samples) and any(s["sample_id"].startswith("sg-") for s in samples)
    assert any(s["messages"][-1]["role"] == "user" for s in samples)
    sharegpt_tools = [s for name, s in good if name == "sharegpt.parquet" and s["tools"]]
    assert sharegpt_tools and all(t["type"] == "function" for s in sharegpt_tools for t in s["tools"])
    schema = pq.read_schema(SAMPLE / "sharegpt.parquet")
    assert schema.field("conversations").type == pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))
    assert sum(p.stat().st_size for p in SAMPLE.iterdir()) < 300_000


def test_make_sample_writes_the_committed_files_again(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "data" / "make_sample.py"), "--out", str(tmp_path)], check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in SAMPLE.iterdir())
    for name in ["openai_chat.jsonl", "tools.jsonl", "bad_rows.jsonl"]:
        assert (tmp_path / name).read_bytes() == (SAMPLE / name).read_bytes(), name
    # Parquet bytes carry the writer's version; the content is what must not drift.
    assert pq.read_table(tmp_path / "sharegpt.parquet").equals(pq.read_table(SAMPLE / "sharegpt.parquet"))
