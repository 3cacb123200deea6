"""Tool-call ids in the form a template demands (Mistral's 9 alphanumerics), the same on every retry."""

from __future__ import annotations

from targets.call_ids import derived_id, id_rule, is_valid, with_valid_ids


def _call(name: str, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": {}}}


def test_only_mistrals_parser_constrains_ids():
    assert id_rule("mistral") == "alnum9"
    assert {id_rule(name) for name in ("hermes", "kimi_k2", "llama3_json", None)} == {None}


def test_derived_ids_are_nine_alphanumerics_and_a_pure_function_of_sample_turn_and_call():
    ids = {derived_id(sample, turn, n) for sample in ("a", "b") for turn in range(3) for n in range(3)}
    assert len(ids) == 18 and all(is_valid(i, "alnum9") for i in ids)
    assert derived_id("a", 1, 2) == derived_id("a", 1, 2)


def test_valid_ids_stay_the_sources_are_reused_by_name_and_the_rest_derived():
    calls = [_call("f", "call_1_0"), _call("g", "Zz9Zz9Zz9"), _call("f", "call_1_2")]
    source = [_call("f", "srcF00001"), _call("g", "call-bad"), _call("f", "Zz9Zz9Zz9")]
    out = with_valid_ids(calls, "alnum9", sample_key="s", turn=1, source_calls=source)
    # f takes the source's valid f id; g keeps the model's; the second f would take the source's other
    # f id, but the model already uses it, so it is derived.
    assert [c["id"] for c in out] == ["srcF00001", "Zz9Zz9Zz9", derived_id("s", 1, 2)]
    assert with_valid_ids(calls, None, sample_key="s", turn=1, source_calls=source) is calls
    for bad in ("call_0_0", "12345678", "1234567890", "abc-12345", 123456789, None):
        assert not is_valid(bad, "alnum9"), bad
