"""The shard codec and the key layout: pure functions, no services."""

from __future__ import annotations

import json

import pytest
import zstandard

from ledger.errors import ConfigError, ShardError, UnsafeKey
from ledger.objects import join_key, parse_s3_url
from ledger.shards import (
    decode_shard,
    encode_shard,
    input_shard_url,
    output_shard_url,
    run_manifest_url,
    sha256_hex,
)

ROWS = [
    {"sample_id": "a", "messages": [{"role": "user", "content": "héllo wörld 你好 🚀"}], "tools": None},
    # U+2028, U+0085 and U+001C are line breaks to str.splitlines(), not to JSONL.
    {"sample_id": "b", "text": "line\u2028sep\x85next\x1crecord\nnewline\ttab", "n": [1, 2.5, True, None]},
    {"sample_id": "c", "surrogate": "\ud800 lone", "nested": {"deep": [{"x": "é"}]}},
]


def test_shard_round_trips_unicode_and_odd_line_separators():
    assert list(decode_shard(encode_shard(ROWS))) == ROWS


def test_shard_is_compact_utf8_json_lines_in_one_checksummed_frame():
    data = encode_shard(ROWS[:2])
    params = zstandard.get_frame_parameters(data)
    raw = zstandard.ZstdDecompressor().decompress(data)
    assert params.has_checksum
    assert params.content_size == len(raw)
    lines = raw.split(b"\n")
    assert lines[-1] == b""  # every row ends with a newline
    assert len(lines) == 3
    assert "你好".encode() in lines[0]  # ensure_ascii=False: no \\u escapes
    assert b", " not in lines[0] and b": " not in lines[0]
    assert json.loads(lines[1]) == ROWS[1]


def test_empty_shard_decodes_to_no_rows():
    assert list(decode_shard(encode_shard([]))) == []


def test_decode_is_lazy_and_streams_many_rows():
    rows = [{"i": i, "pad": "x" * 100} for i in range(20_000)]  # ~2 MB, many decode chunks
    decoded = decode_shard(encode_shard(rows))
    assert next(decoded) == rows[0]
    assert list(decoded) == rows[1:]


def test_truncated_shard_is_an_error_not_fewer_rows():
    data = encode_shard([{"i": i, "r": str(i) * 50} for i in range(2000)])
    with pytest.raises(ShardError, match="truncated"):
        list(decode_shard(data[: len(data) // 2]))
    with pytest.raises(ShardError, match="truncated"):
        list(decode_shard(data[:-4]))  # only the checksum missing


def test_corrupt_shard_fails_its_checksum():
    data = bytearray(encode_shard(ROWS))
    data[-2] ^= 0xFF  # inside the frame checksum
    with pytest.raises(ShardError, match="corrupt"):
        list(decode_shard(bytes(data)))


def test_data_that_is_not_zstd_is_refused():
    with pytest.raises(ShardError, match="corrupt"):
        list(decode_shard(b'{"sample_id": "plain json"}\n'))


def test_bytes_after_the_frame_are_refused():
    with pytest.raises(ShardError, match="after the zstd frame"):
        list(decode_shard(encode_shard(ROWS) + b"junk"))


def test_a_line_that_is_not_a_json_object_is_refused():
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    with pytest.raises(ShardError, match="line 2 .*not an object"):
        list(decode_shard(compressor.compress(b'{"a":1}\n[1,2]\n')))
    with pytest.raises(ShardError, match="line 1 .*not valid JSON"):
        list(decode_shard(compressor.compress(b"{oops\n")))


@pytest.mark.parametrize("row", [{"x": float("nan")}, {"x": {1, 2}}, ["not", "a", "dict"]])
def test_rows_that_cannot_be_json_are_refused_when_encoding(row):
    with pytest.raises(ShardError):
        encode_shard([row])


def test_sha256_hex_is_the_hex_digest():
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


# -- keys ---------------------------------------------------------------------------------------


def test_shard_urls_follow_the_layout():
    assert input_shard_url("s3://bkt/runs/r1", 7) == "s3://bkt/runs/r1/inputs/batch-000007.jsonl.zst"
    assert output_shard_url("s3://bkt/runs/r1/", 123456) == "s3://bkt/runs/r1/outputs/batch-123456.jsonl.zst"
    assert run_manifest_url("s3://bkt/runs/r1") == "s3://bkt/runs/r1/run.json"
    assert input_shard_url("s3://bkt", 0) == "s3://bkt/inputs/batch-000000.jsonl.zst"


@pytest.mark.parametrize("seq", [-1, True, 1.0, "3"])
def test_shard_urls_refuse_odd_sequence_numbers(seq):
    with pytest.raises(ValueError):
        input_shard_url("s3://bkt/r", seq)


def test_parse_s3_url_splits_bucket_and_key():
    assert parse_s3_url("s3://bkt/a/b.json") == ("bkt", "a/b.json")
    assert parse_s3_url("s3://my.bucket-1") == ("my.bucket-1", "")


@pytest.mark.parametrize("url", ["https://bkt/key", "/local/path", "s3:///key", "s3://Bkt/k", "s3://b/k", "S3://bkt/k"])
def test_parse_s3_url_refuses_what_is_not_an_s3_url(url):
    with pytest.raises(ConfigError):
        parse_s3_url(url)


def test_join_key_appends_segments_and_keeps_unicode():
    assert join_key("s3://bkt/out/", "inputs", "données/é.json") == "s3://bkt/out/inputs/données/é.json"


@pytest.mark.parametrize("part", [
    "../escape", "a/../../b", "..", "./a", "/absolute", "a//b", "a/", "", "a\\..\\b", "tab\there",
    "nul\x00", "del\x7f", "lone\ud800",
])
def test_join_key_refuses_parts_that_could_escape_the_prefix(part):
    with pytest.raises(UnsafeKey):
        join_key("s3://bkt/runs/r1", part)


def test_join_key_refuses_keys_longer_than_s3_allows():
    with pytest.raises(UnsafeKey, match="1024"):
        join_key("s3://bkt/r", "é" * 600)


# -- packed input objects -----------------------------------------------------------------------


def test_packed_shards_are_read_back_one_range_at_a_time_and_whole():
    from ledger.shards import decode_packed, pack_shards

    shards = [encode_shard(ROWS[:1]), encode_shard(ROWS[1:]), encode_shard([])]
    data, ranges = pack_shards(shards)
    assert [r[:2] for r in ranges] == [(0, len(shards[0])), (len(shards[0]), len(shards[1])),
                                       (len(shards[0]) + len(shards[1]), len(shards[2]))]
    for shard, (offset, length, digest) in zip(shards, ranges, strict=True):
        assert data[offset:offset + length] == shard and digest == sha256_hex(shard)
    assert list(decode_shard(data[ranges[1][0]:ranges[1][0] + ranges[1][1]])) == ROWS[1:]
    assert list(decode_packed(data)) == ROWS
    # The whole object is one zstd stream of JSON lines: any zstd tool reads it.
    assert zstandard.ZstdDecompressor().decompressobj().decompress(data).count(b"\n") >= 1


def test_a_truncated_or_padded_packed_object_fails_loudly():
    from ledger.shards import decode_packed, pack_shards

    data, _ = pack_shards([encode_shard(ROWS[:1]), encode_shard(ROWS[1:])])
    with pytest.raises(ShardError, match="truncated packed object"):
        list(decode_packed(data[:-3]))
    with pytest.raises(ShardError, match="corrupt packed object at byte"):
        list(decode_packed(data + b"junk"))


def test_a_group_object_is_named_by_its_first_batch():
    from ledger.shards import input_group_url

    assert input_group_url("s3://bkt/runs/r1", 33) == "s3://bkt/runs/r1/inputs/group-000033.jsonl.zst"
    with pytest.raises(ValueError):
        input_group_url("s3://bkt/r", -1)
