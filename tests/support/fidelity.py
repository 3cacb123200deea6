"""Checks the fidelity suites of every model family share."""

from __future__ import annotations


def assert_prompts_are_fresh_renderings(rows: list[dict], tokenizer) -> int:
    """Every generation event's prompt ids equal a fresh transformers rendering of its context.

    Returns the number of events checked; every row must be done.
    """
    checked = 0
    for row in rows:
        assert row["status"] == "done", row.get("error")
        for event in row["events"]:
            context = row["messages"][:event["message_index"]]
            expected = tokenizer.apply_chat_template(
                context, tools=row["tools"] or None, add_generation_prompt=True, enable_thinking=row["thinking"],
                tokenize=True, return_dict=False)
            assert event["prompt_token_ids"] == list(expected), (row["sample_id"], event["turn"])
            checked += 1
    return checked
