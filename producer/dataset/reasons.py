"""Why an input row did not become a sample: the stable codes of ``rejected_rows.reason``.

Users count these (``select reason, count(*) from rejected_rows group by reason``),
so a code, once shipped, is never renamed or reused for something else. The
``detail`` stored beside it names the field and turn index and is kept short.
"""

from __future__ import annotations

# Codes the readers give (the line or file could not be read as a JSON object).
UNREADABLE_FILE = "unreadable_file"
INVALID_UTF8 = "invalid_utf8"
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"

# Codes the normaliser gives (the object is not a conversation regen can use).
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
EMPTY_CONVERSATION = "empty_conversation"
UNKNOWN_ROLE = "unknown_role"
NO_USER_TURN = "no_user_turn"
TOOL_WITHOUT_CALL = "tool_without_call"
UNSUPPORTED_CONTENT = "unsupported_content"
INVALID_TOOL_ARGUMENTS = "invalid_tool_arguments"
INVALID_TOOLS = "invalid_tools"
ID_TOO_LONG = "id_too_long"
INVALID_ID = "invalid_id"
TOO_LARGE = "too_large"

# Given by the submitter, which is the only place that sees every row of a run.
DUPLICATE_ID = "duplicate_id"

#: Every reason code, with the one line the docs and ``regen status`` show for it.
REASONS: dict[str, str] = {
    UNREADABLE_FILE: "the file (or the rest of it, from this row on) cannot be read: corrupt or truncated "
                     "Parquet or Arrow, a corrupt .gz/.zst stream, or a JSON array broken at this element",
    INVALID_UTF8: "the line is not valid UTF-8, or its JSON holds a lone surrogate escape (\\ud800)",
    MALFORMED_JSON: "the line is not valid JSON (the parser's message is in the detail)",
    NOT_AN_OBJECT: "the line is valid JSON but not an object (an array, a string, a number)",
    MISSING_FIELD: "a required field is absent or null: messages/conversations, a turn's role or content",
    WRONG_TYPE: "a field has the wrong type (named in the detail), or sits where it is not allowed",
    EMPTY_CONVERSATION: "messages/conversations is an empty list",
    UNKNOWN_ROLE: "a turn's role (or ShareGPT 'from') is not one regen knows",
    NO_USER_TURN: "the conversation has no user turn, so there is nothing to answer",
    TOOL_WITHOUT_CALL: "a tool result is not preceded by an assistant turn with tool calls",
    UNSUPPORTED_CONTENT: "a non-text content part (image, audio) or a non-function tool or tool call",
    INVALID_TOOL_ARGUMENTS: "a tool call's arguments (or a ShareGPT function_call value) are not a JSON object, "
                            "or hold a value JSON cannot carry (NaN, a datetime, bytes: a Parquet column's)",
    INVALID_TOOLS: "tools is not a list of function specs (unparsable JSON string, spec without a name, "
                   "or a value JSON cannot carry: NaN, a datetime, bytes)",
    ID_TOO_LONG: "the row's id is longer than the limit (see producer.dataset.normalize.MAX_ID_CHARS)",
    INVALID_ID: "the row's id holds a NUL character, which the ledger (Postgres text) cannot store",
    TOO_LARGE: "the line or conversation exceeds a size limit (see producer.dataset.normalize and producer.dataset.readers)",
    DUPLICATE_ID: "another row of the run already has this sample id (the first one wins)",
}
