"""One bad value is one rejected row, named, and the rest of the submit goes on (issue 58, item 6).

A Parquet file gives Python values, not parsed JSON: a NaN, a datetime or bytes in a tool call's
arguments or a tool spec, which JSON cannot carry, aborted the whole submit outside InputRowError;
a NUL in an id killed the group's COPY. Against the real Postgres, Redis and moto S3.
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import text

from ledger.dispatch import make_celery
from ledger.objects import ObjectStore
from producer.run_config import build_run_config
from producer.submit import submit_run

ARGUMENTS = pa.struct([("x", pa.float64()), ("when", pa.timestamp("us")), ("blob", pa.binary())])
CALL = pa.struct([("type", pa.string()), ("function", pa.struct([("name", pa.string()), ("arguments", ARGUMENTS)]))])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(CALL))])
TOOL = pa.struct([("type", pa.string()), ("function", pa.struct([
    ("name", pa.string()), ("parameters", pa.struct([("type", pa.string()), ("default", pa.timestamp("us"))]))]))])
SCHEMA = pa.schema([("id", pa.string()), ("messages", pa.list_(MESSAGE)), ("tools", pa.list_(TOOL))])
WHEN = datetime.datetime(2026, 1, 2, 3, 4, 5)


def _row(i: int, *, arguments: dict | None = None, tools: list | None = None, row_id: str | None = None) -> dict:
    messages = [{"role": "user", "content": f"question {i}"}]
    if arguments is not None:
        messages += [{"role": "assistant", "content": None,
                      "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": arguments}}]},
                     {"role": "tool", "content": "42"}]
    return {"id": row_id or f"p{i}", "messages": messages, "tools": tools}


def test_nan_datetime_bytes_and_nul_are_each_one_rejected_row_and_the_rest_is_registered(settings, sessions,
                                                                                       s3_bucket, tmp_path):
    rows = [
        _row(0),
        _row(1, arguments={"x": float("nan")}),
        _row(2, arguments={"when": WHEN}),
        _row(3, arguments={"blob": b"\x00\x01"}),
        _row(4, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                      "default": WHEN}}}]),
        _row(5, row_id="p\x005"),
        _row(6, arguments={"x": 1.5}),
    ]
    path = tmp_path / "values.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    report = submit_run(sessions, make_celery(settings), ObjectStore(), [str(path)], run_name="v",
                        config=build_run_config("tiny", max_tokens=8, seed=1), output_url=f"{s3_bucket}/v",
                        batch_size=4, queue="regen")
    assert (report.rows_read, report.samples_new, report.rejected) == (7, 2, 5)
    with sessions() as s:
        rejected = {r.source_row: (r.reason, r.detail) for r in s.execute(text(
            "SELECT source_row, reason, detail FROM rejected_rows ORDER BY source_row"))}
        registered = sorted(s.scalars(text("SELECT sample_id FROM samples")))
    assert registered == ["p0", "p6"]
    expected = {
        1: ("invalid_tool_arguments", "messages[1].tool_calls[0].function.arguments.x is nan"),
        2: ("invalid_tool_arguments", "messages[1].tool_calls[0].function.arguments.when is a datetime value"),
        3: ("invalid_tool_arguments", "messages[1].tool_calls[0].function.arguments.blob is a bytes value"),
        4: ("invalid_tools", "tools[0].function.parameters.default is a datetime value"),
        5: ("invalid_id", "id 'p\\x005' holds a NUL character"),
    }
    assert {row: reason for row, (reason, _) in rejected.items()} == {row: r for row, (r, _) in expected.items()}
    for row, (_, start) in expected.items():
        assert rejected[row][1].startswith(start), (row, rejected[row][1])
