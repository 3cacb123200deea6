"""Checks the fidelity suites of every model family share."""

from __future__ import annotations


def assert_prompts_are_fresh_renderings(rows: list[dict], tokenizer) -> int:
    """Every generation event's prompt ids equal a fresh transformers rendering of its context.

    The thinking argument is the one the row's run recorded (``enable_thinking`` where it names none), the history
    keyword (``preserve_thinking``) as the row says it was rendered;
    calls' arguments go in the form the template takes (DeepSeek's: JSON text).
    Returns the number of events checked; every row must be done.
    """
    from targets.template_probe import as_template_takes, probe_template

    found = probe_template(tokenizer.chat_template)
    checked = 0
    for row in rows:
        assert row["status"] == "done", row.get("error")
        arg = (row.get("sampling") or {}).get("thinking_arg", "enable_thinking")
        if arg == "auto":  # the worker found it in the template it loaded
            arg = found.thinking_arg if found else "enable_thinking"
        switch = {} if arg in (None, "none") else {arg: row["thinking"]}
        # The history keyword (Qwen3.6's preserve_thinking) as the row was rendered with it.
        history_arg = (row.get("sampling") or {}).get("history_arg")
        if history_arg == "auto":
            history_arg = found.history_arg if found else None
        if history_arg and row.get("preserve_thinking") is not None:
            switch[history_arg] = row["preserve_thinking"]
        for event in row["events"]:
            context = as_template_takes(row["messages"][:event["message_index"]],
                                        found.call_arguments if found else "object")
            expected = tokenizer.apply_chat_template(
                context, tools=row["tools"] or None, add_generation_prompt=True, **switch,
                tokenize=True, return_dict=False)
            assert event["prompt_token_ids"] == list(expected), (row["sample_id"], event["turn"])
            checked += 1
    return checked
