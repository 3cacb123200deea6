"""Input forms people have: JSON arrays (streamed), datasets' save_to_disk folders, folders of shards, .gz/.zst."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from producer.dataset import json_array, readers
from producer.dataset.readers import RawRow, iter_input_paths, iter_rows

USER = {"role": "user", "content": "hi"}


def rows_of(paths) -> list[tuple[str, int, object, str | None]]:
    return [(Path(r.file).name, r.row, r.obj, r.error.reason if r.error else None) for r in iter_rows(paths)]


def test_a_json_array_of_conversations_is_read_as_rows_with_zero_based_indexes(tmp_path):
    convs = [{"conversations": [{"from": "human", "value": f"q{i} ünïcode"}]} for i in range(3)]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs, indent=2, ensure_ascii=False), encoding="utf-8")
    assert rows_of([path]) == [("sharegpt.json", i, c, None) for i, c in enumerate(convs)]


def test_a_json_array_element_that_is_not_an_object_is_rejected_and_the_next_one_read(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('\ufeff [ {"n": 0}, [1, 2], "x", {"n": 3} ]\n', encoding="utf-8")
    assert [(row, reason) for _, row, _, reason in rows_of([path])] == [
        (0, None), (1, "not_an_object"), (2, "not_an_object"), (3, None)]


def test_a_json_array_broken_mid_way_ends_in_one_row_naming_where(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"n": 0}, {"n": 1 "oops": 2}, {"n": 2}]')
    out = list(iter_rows([path]))
    assert [(r.row, r.error.reason if r.error else None) for r in out] == [(0, None), (1, "unreadable_file")]
    assert "Expecting ',' delimiter" in out[1].error.detail and "rest of the file" in out[1].error.detail


def test_a_truncated_json_array_keeps_the_elements_before_the_cut(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"n": i} for i in range(5)])[:-10])
    out = list(iter_rows([path]))
    assert [r.obj for r in out if r.obj] == [{"n": i} for i in range(4)]  # cut inside element 4
    assert out[-1].error.reason == "unreadable_file"


def test_json_array_elements_cut_by_every_chunk_boundary_read_whole(tmp_path, monkeypatch):
    # A 7-character chunk cuts numbers, literals, escapes and strings at every offset.
    monkeypatch.setattr(json_array, "CHUNK_CHARS", 7)
    convs = [{"n": 12345 + i, "f": 1.5e10, "t": True, "z": None, "s": "a\"b\\u00e9" * i} for i in range(40)]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(convs))
    assert [r.obj for r in iter_rows([path])] == convs


def test_an_empty_json_array_yields_no_rows(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(" [ ] \n")
    assert list(iter_rows([path])) == []


def test_a_json_array_is_streamed_not_loaded_whole(tmp_path, monkeypatch):
    # Smaller reads than the defaults (1 MiB each), so the fixed buffers are small beside the file.
    monkeypatch.setattr(json_array, "CHUNK_CHARS", 1 << 16)
    monkeypatch.setattr(readers, "_READ_BUFFER_BYTES", 1 << 16)
    text = "lorem ipsum dolor sit amet " * 40
    path = tmp_path / "big.json"
    with path.open("w") as f:
        f.write("[" + ",".join(json.dumps({"messages": [{"role": "user", "content": f"{i} {text}"}]})
                               for i in range(10_000)) + "]")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        count = sum(1 for r in iter_rows([path]) if r.obj is not None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 10_000
    assert peak < size / 10, f"peak {peak} bytes while reading a {size}-byte array"


def test_gzip_compressed_jsonl_and_json_arrays_are_read(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"n": 1}\n\n{"n": 2}\n'))
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(b'[{"n": 3}, {"n": 4}]'))
    (tmp_path / "c.json.zst").write_bytes(zstandard.ZstdCompressor().compress(b'[{"n": 5}]'))
    assert rows_of([tmp_path]) == [("a.jsonl.gz", 1, {"n": 1}, None), ("a.jsonl.gz", 3, {"n": 2}, None),
                                   ("b.json.gz", 0, {"n": 3}, None), ("b.json.gz", 1, {"n": 4}, None),
                                   ("c.json.zst", 0, {"n": 5}, None)]


def test_a_truncated_gzip_file_is_an_unreadable_file_row(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"n": 1}\n' * 1000)[:-20])
    out = list(iter_rows([path]))
    assert out[-1].error.reason == "unreadable_file" and "gzip" in out[-1].error.detail


def test_a_datasets_save_to_disk_folder_is_one_dataset_and_its_metadata_is_not_read(tmp_path):
    import datasets

    rows = [{"messages": [USER], "id": f"r{i}", "image": b"\x00" * 10} for i in range(5)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"), max_shard_size=200)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:2]), "test": datasets.Dataset.from_list(rows[2:3])}
                         ).save_to_disk(str(tmp_path / "splits"))
    files = [p.relative_to(tmp_path).as_posix() for p in iter_input_paths([tmp_path])]
    assert files and all(f.endswith(".arrow") for f in files)
    out = list(iter_rows([tmp_path / "saved"]))
    # The normaliser's fields only: the image column is never decoded.
    assert [r.obj for r in out] == [{"messages": [USER], "id": f"r{i}"} for i in range(5)]
    assert [r.obj["id"] for r in iter_rows([tmp_path / "splits"])] == ["r2", "r0", "r1"]  # test/, then train/


def test_a_folder_of_parquet_and_jsonl_shards_is_one_dataset_in_file_order(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"id": "p0"}, {"id": "p1"}]), tmp_path / "part-000.parquet")
    (tmp_path / "part-001.jsonl").write_text('{"id": "j1"}\n')
    assert [(name, row, obj["id"]) for name, row, obj, _ in rows_of([tmp_path])] == [
        ("part-000.parquet", 0, "p0"), ("part-000.parquet", 1, "p1"), ("part-001.jsonl", 1, "j1")]


def test_rows_are_keyed_by_the_resolved_file_whatever_folder_it_is_named_from(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "chats.jsonl").write_text('{"n": 1}\n')
    os.symlink(tmp_path / "data", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    from_root = next(iter_rows(["data/chats.jsonl"]))
    monkeypatch.chdir(tmp_path / "data")
    from_data = next(iter_rows(["chats.jsonl"]))
    through_link = next(iter_rows([tmp_path / "link" / "chats.jsonl"]))
    assert from_root == from_data == through_link == RawRow(str((tmp_path / "data" / "chats.jsonl").resolve()),
                                                            1, {"n": 1}, None)
