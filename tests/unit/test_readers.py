"""Streaming dataset readers: paths, JSONL and Parquet rows, per-row and per-file errors."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from ledger.errors import ConfigError
from producer.dataset import readers
from producer.dataset.readers import RawRow, iter_input_paths, iter_rows

USER = {"role": "user", "content": "hi"}


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def errors(rows: list[RawRow]) -> list[tuple[int, str]]:
    return [(r.row, r.error.reason) for r in rows if r.error is not None]


# --- iter_input_paths ----------------------------------------------------------------------


def test_folders_are_walked_recursively_sorted_and_other_files_ignored(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    for name in ["b.jsonl", "a.parquet", "sub/c.json", "sub/deeper/d.jsonl.zst", "README.md", "sub/x.csv"]:
        (tmp_path / name).write_bytes(b"")
    found = iter_input_paths([str(tmp_path)])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "a.parquet", "b.jsonl", "sub/c.json", "sub/deeper/d.jsonl.zst"]


def test_hidden_files_and_folders_are_skipped(tmp_path):
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x.jsonl").write_bytes(b"")
    (tmp_path / "._a.parquet").write_bytes(b"")
    (tmp_path / "a.jsonl").write_bytes(b"")
    assert [p.name for p in iter_input_paths([tmp_path])] == ["a.jsonl"]


def test_argument_order_does_not_change_the_file_order_and_repeats_are_dropped(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [])
    b = write_jsonl(tmp_path / "b.jsonl", [])
    assert iter_input_paths([str(b), str(a)]) == iter_input_paths([str(a), str(b), str(tmp_path)]) == [a, b]


def test_a_missing_path_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="nope.jsonl: no such file"):
        iter_input_paths([str(tmp_path / "nope.jsonl")])


def test_a_named_file_of_an_unsupported_type_is_a_config_error(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match="unsupported file type"):
        iter_input_paths([str(tmp_path / "data.csv")])


@pytest.mark.parametrize("other_file", [None, "notes.txt"])
def test_a_folder_without_input_files_is_a_config_error(tmp_path, other_file):
    if other_file:
        (tmp_path / other_file).write_text("x")
    with pytest.raises(ConfigError, match="folder holds no"):
        iter_input_paths([str(tmp_path)])


def test_no_paths_at_all_is_a_config_error():
    with pytest.raises(ConfigError, match="no input paths"):
        iter_input_paths([])


def test_a_bad_path_fails_the_iter_rows_call_itself_not_the_first_row(tmp_path):
    with pytest.raises(ConfigError):
        iter_rows([tmp_path / "missing.jsonl"])


# --- JSONL -----------------------------------------------------------------------------------


def test_jsonl_rows_carry_their_one_based_line_numbers_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"n": 1}\n\n   \n{"n": 2}\r\n{"n": 3}')  # CRLF and no final newline
    rows = list(iter_rows([str(path)]))
    assert [(r.file, r.row, r.obj) for r in rows] == [
        (str(path), 1, {"n": 1}), (str(path), 4, {"n": 2}), (str(path), 5, {"n": 3})]
    assert all(r.error is None for r in rows)


def test_a_utf8_byte_order_mark_is_ignored(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"n": 1}\n')
    assert [r.obj for r in iter_rows([path])] == [{"n": 1}]


def test_invalid_utf8_is_an_error_of_that_row_only(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"n": 1}\n{"t": "caf\xe9"}\n{"n": 3}\n')
    rows = list(iter_rows([path]))
    assert errors(rows) == [(2, "invalid_utf8")]
    assert "0xe9" in rows[1].error.detail
    assert [r.obj for r in rows if r.obj] == [{"n": 1}, {"n": 3}]


def test_malformed_json_gives_the_parser_message(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"messages": [}\n{"t": "unterminated}\n')
    rows = list(iter_rows([path]))
    assert errors(rows) == [(1, "malformed_json"), (2, "malformed_json")]
    assert "column" in rows[0].error.detail and "Unterminated string" in rows[1].error.detail


@pytest.mark.parametrize("line", [b'{"x": NaN}', b'{"x": -Infinity}'])
def test_nan_and_infinity_are_malformed_json(tmp_path, line):
    path = tmp_path / "a.jsonl"
    path.write_bytes(line + b"\n")
    assert errors(list(iter_rows([path]))) == [(1, "malformed_json")]


def test_json_nested_beyond_the_recursion_limit_is_malformed_not_a_crash(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    assert errors(list(iter_rows([path]))) == [(1, "malformed_json")]


@pytest.mark.parametrize("value", [[1, 2], "text", 3, None, True])
def test_a_json_value_that_is_not_an_object_is_rejected(tmp_path, value):
    path = write_jsonl(tmp_path / "a.jsonl", [value])
    rows = list(iter_rows([path]))
    assert errors(rows) == [(1, "not_an_object")]


def test_a_lone_surrogate_escape_is_invalid_utf8_but_an_escaped_emoji_is_fine(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"t": "\\ud83d\\ude00"}\n{"t": "half \\ud83d pair"}\n{"t": "\\uD800"}\n')
    rows = list(iter_rows([path]))
    assert rows[0].obj == {"t": "\U0001F600"}
    assert errors(rows) == [(2, "invalid_utf8"), (3, "invalid_utf8")]


def test_a_line_longer_than_the_limit_is_too_large_and_the_next_line_still_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 64)
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"t": "' + b"x" * 500 + b'"}\n{"n": 2}\n')
    rows = list(iter_rows([path]))
    assert errors(rows) == [(1, "too_large")]
    assert (rows[1].row, rows[1].obj) == (2, {"n": 2})


def test_a_json_file_holding_one_array_is_read_as_its_elements(tmp_path):
    # More on arrays in test_input_forms.py.
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"messages": [USER]}, {"messages": [USER]}], indent=2))
    assert [(r.row, r.obj) for r in iter_rows([path])] == [(0, {"messages": [USER]}), (1, {"messages": [USER]})]


def test_a_json_file_of_json_lines_reads_like_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "a.json", [{"n": 1}, {"n": 2}])
    assert [r.obj for r in iter_rows([path])] == [{"n": 1}, {"n": 2}]


def test_zstd_compressed_jsonl_is_read(tmp_path):
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"n": 1}\n\n{"n": 2}\n'))
    assert [(r.row, r.obj) for r in iter_rows([path])] == [(1, {"n": 1}), (3, {"n": 2})]


def test_a_corrupt_zstd_file_is_an_unreadable_file_row(tmp_path):
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00garbage" * 10)
    assert errors(list(iter_rows([path]))) == [(1, "unreadable_file")]


def test_jsonl_is_read_lazily_not_up_front(tmp_path):
    # Rows appended after the first row was taken still come out: the reader had
    # not read the file ahead beyond its buffer.
    path = write_jsonl(tmp_path / "a.jsonl", [{"n": i, "pad": "x" * 100} for i in range(50_000)])
    rows = iter_rows([path])
    assert next(rows).obj["n"] == 0
    with path.open("a") as f:
        f.write(json.dumps({"n": "appended"}) + "\n")
    assert [r.obj["n"] for r in rows][-1] == "appended"


def test_files_are_read_in_sorted_order(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [{"f": "b"}])
    write_jsonl(tmp_path / "a.jsonl", [{"f": "a"}])
    assert [r.obj["f"] for r in iter_rows([tmp_path / "b.jsonl", tmp_path / "a.jsonl"])] == ["a", "b"]


def test_raw_rows_are_frozen():
    row = RawRow("a.jsonl", 1, {}, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.row = 2  # type: ignore[misc]


# --- Parquet ---------------------------------------------------------------------------------

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string())])
TURN = pa.struct([("from", pa.string()), ("value", pa.string())])


def write_parquet(path: Path, rows: list[dict], schema: pa.Schema, **kwargs) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, **kwargs)
    return path


def test_parquet_nested_list_of_struct_columns_become_dicts_with_zero_based_rows(tmp_path):
    schema = pa.schema([("id", pa.string()), ("messages", pa.list_(MESSAGE))])
    path = write_parquet(tmp_path / "a.parquet", [
        {"id": "a", "messages": [{"role": "user", "content": "hi"}]},  # name absent in this row
        {"id": None, "messages": None},
        {"id": "c", "messages": [{"role": "user", "content": "x", "name": "bob"}]},
    ], schema)
    rows = list(iter_rows([path]))
    assert [(r.row, r.error) for r in rows] == [(0, None), (1, None), (2, None)]
    assert rows[0].obj == {"id": "a", "messages": [{"role": "user", "content": "hi", "name": None}]}
    assert rows[1].obj == {"id": None, "messages": None}
    assert rows[2].obj["messages"][0]["name"] == "bob"


def test_parquet_sharegpt_column_as_hf_datasets_writes_it(tmp_path):
    schema = pa.schema([("conversations", pa.list_(TURN)), ("system", pa.string())])
    path = write_parquet(tmp_path / "s.parquet", [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], "system": ""}], schema)
    [row] = iter_rows([path])
    assert row.obj == {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
                       "system": ""}


def test_parquet_rows_count_on_across_row_groups_and_batches(tmp_path):
    schema = pa.schema([("id", pa.int64())])
    path = write_parquet(tmp_path / "a.parquet", [{"id": i} for i in range(250)], schema, row_group_size=60)
    rows = list(iter_rows([path], batch_rows=7))
    assert [r.row for r in rows] == list(range(250))
    assert [r.obj["id"] for r in rows] == list(range(250))


def test_parquet_reads_only_the_requested_columns(tmp_path):
    schema = pa.schema([("id", pa.string()), ("image", pa.binary()), ("messages", pa.list_(MESSAGE))])
    path = write_parquet(tmp_path / "a.parquet", [{"id": "a", "image": b"\x89PNG", "messages": []}], schema)
    [row] = iter_rows([path])
    assert set(row.obj) == {"id", "messages"}
    [row] = iter_rows([path], columns=None)
    assert set(row.obj) == {"id", "image", "messages"}


def test_parquet_without_any_known_column_gives_one_empty_object_per_row(tmp_path):
    schema = pa.schema([("prompt", pa.string())])
    path = write_parquet(tmp_path / "a.parquet", [{"prompt": "a"}, {"prompt": "b"}], schema)
    assert [(r.row, r.obj) for r in iter_rows([path])] == [(0, {}), (1, {})]


def test_a_truncated_parquet_file_is_one_unreadable_file_row_and_other_files_still_read(tmp_path):
    schema = pa.schema([("id", pa.string())])
    good = write_parquet(tmp_path / "a.parquet", [{"id": "x"}], schema)
    bad = tmp_path / "b.parquet"
    bad.write_bytes(good.read_bytes()[:-20])
    write_jsonl(tmp_path / "c.jsonl", [{"id": "y"}])
    rows = list(iter_rows([tmp_path]))
    assert [(Path(r.file).name, r.row, r.error.reason if r.error else None) for r in rows] == [
        ("a.parquet", 0, None), ("b.parquet", 0, "unreadable_file"), ("c.jsonl", 1, None)]


def test_a_corrupt_row_group_costs_only_its_own_rows(tmp_path):
    schema = pa.schema([("id", pa.string()), ("messages", pa.list_(MESSAGE))])
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i} " * 20}]} for i in range(300)]
    path = write_parquet(tmp_path / "a.parquet", rows, schema, row_group_size=100, compression="zstd")
    column = pq.ParquetFile(path).metadata.row_group(1).column(2)  # messages.content of rows 100-199
    data = bytearray(path.read_bytes())
    middle = column.data_page_offset + column.total_compressed_size // 2
    data[middle:middle + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    out = list(iter_rows([path]))
    assert errors(out) == [(100, "unreadable_file")]
    assert "row group 1 (rows 100 to 199)" in out[100].error.detail
    assert [r.row for r in out if r.obj] == list(range(100)) + list(range(200, 300))


def test_parquet_is_streamed_not_loaded_whole(tmp_path):
    # One row group of 20,000 rows (~30 MB of text): the first row must come out
    # without pyarrow holding anything like the whole file.
    schema = pa.schema([("messages", pa.list_(MESSAGE))])
    text = "lorem ipsum dolor sit amet " * 60
    rows = [{"messages": [{"role": "user", "content": f"{i} {text}"}]} for i in range(20_000)]
    path = write_parquet(tmp_path / "big.parquet", rows, schema, row_group_size=1_000_000, compression="none")
    del rows
    before = pa.total_allocated_bytes()
    stream = iter_rows([path])
    first = next(stream)
    held = pa.total_allocated_bytes() - before
    assert first.obj["messages"][0]["content"].startswith("0 ")
    assert held < path.stat().st_size / 4, f"pyarrow holds {held} bytes of a {path.stat().st_size}-byte file"
    assert sum(1 for _ in stream) == 19_999


def test_the_producer_readers_import_neither_torch_nor_vllm():
    code = ("import sys, producer.dataset.readers, producer.dataset.normalize; "
            "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
