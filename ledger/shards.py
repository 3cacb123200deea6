"""The shard codec (JSONL in one zstd frame) and where shards live under a run's output URL.

A shard is a batch of rows: the producer writes input shards, a worker writes one
output shard per batch. One compact JSON object per line, UTF-8, compressed as a
single zstd frame that records its content size and a checksum, so a truncated
or damaged object fails loudly instead of yielding fewer rows.

Layout under a run's output URL::

    <output>/run.json                            the run manifest
    <output>/inputs/group-000033.jsonl.zst       input shards of batches 33-64, packed (a submit)
    <output>/inputs/batch-000042.jsonl.zst       input shard of batch 42 alone (retry --failed, older runs)
    <output>/outputs/batch-000042.jsonl.zst      output shard of batch 42

A packed input object is the batches' shards one after another: each a complete zstd
frame, so the object as a whole is also one valid zstd stream of JSON lines. The ledger
keeps each batch's byte range and the range's SHA-256 (``InputSlice``, migration 0006): a
worker reads and verifies its batch alone. Packing is for the store's sake: one PUT per
32 batches instead of one per batch (docs/performance.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zstandard

from ledger.errors import ShardError
from ledger.objects import join_key, sha256_hex

if TYPE_CHECKING:
    from ledger.objects import ObjectStore

__all__ = ["InputSlice", "decode_packed", "decode_shard", "encode_shard", "input_group_url", "input_shard_url",
           "output_shard_url", "pack_shards", "read_input_shard", "run_manifest_url", "sha256_hex"]

#: zstd level 3 (zstd's default): ~5x on chat JSON at hundreds of MB/s; higher
#: levels cost CPU on the GPU nodes for a few percent of storage.
ZSTD_LEVEL = 3
#: Compressed bytes fed to the decompressor at a time, so decoding a shard holds
#: one chunk of output, not the whole decompressed shard, beside the input.
_DECODE_CHUNK_BYTES = 256 * 1024


def encode_shard(rows: Iterable[dict[str, Any]]) -> bytes:
    """Encode rows as zstd-compressed JSON lines.

    Raises:
        ShardError: a row is not a dict or cannot be JSON-encoded (NaN, sets, ...).
    """
    lines = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ShardError(f"row {index} is a {type(row).__name__}, not a dict")
        try:
            text = json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ShardError(f"row {index} cannot be encoded as JSON: {e}") from e
        try:
            lines.append(text.encode("utf-8"))
        except UnicodeEncodeError:
            # A lone surrogate (e.g. "\ud800" parsed from a JSON escape in the dataset)
            # has no UTF-8 form; escaping it keeps the row valid JSON and round-trips exactly.
            lines.append(json.dumps(row, ensure_ascii=True, separators=(",", ":")).encode("ascii"))
        lines.append(b"\n")
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=True)
    return compressor.compress(b"".join(lines))


def decode_shard(data: bytes) -> Iterator[dict[str, Any]]:
    """Yield the rows of a shard as they are decompressed.

    Lines are split on ``\\n`` bytes only: U+2028, U+0085 and friends may appear
    raw inside strings (``ensure_ascii=False``) and are not line ends.

    Raises:
        ShardError: the data is not zstd, is corrupt (checksum), truncated, has bytes
            after the frame, or a line is not a JSON object. Rows before the fault may
            already have been yielded; callers should treat the shard as unreadable.
    """
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    pending = b""
    line_number = 0
    offset = 0
    while offset < len(data) and not decompressor.eof:
        chunk = data[offset:offset + _DECODE_CHUNK_BYTES]
        offset += len(chunk)
        try:
            pending += decompressor.decompress(chunk)
        except zstandard.ZstdError as e:
            raise ShardError(f"corrupt shard: {e}") from e
        *complete, pending = pending.split(b"\n")
        for line in complete:
            line_number += 1
            yield _parse_line(line, line_number)
    if not decompressor.eof:
        raise ShardError(f"truncated shard: the zstd frame ends early ({len(data)} bytes read)")
    if decompressor.unused_data or offset < len(data):
        raise ShardError("corrupt shard: unexpected bytes after the zstd frame")
    if pending:
        # Our encoder ends every row with "\n"; a missing one means a different writer.
        raise ShardError(f"corrupt shard: line {line_number + 1} has no trailing newline")


@dataclass(frozen=True)
class InputSlice:
    """Where a batch's input shard is: ``key``, and in a packed object its byte range and the range's SHA-256.

    ``offset`` None: the whole object is the shard (checked against the store's own checksum).
    """

    key: str
    offset: int | None = None
    length: int | None = None
    sha256: str | None = None


def pack_shards(shards: Sequence[bytes]) -> tuple[bytes, list[tuple[int, int, str]]]:
    """One object holding ``shards`` back to back, and ``(offset, length, sha256)`` of each in it."""
    ranges, offset = [], 0
    for shard in shards:
        ranges.append((offset, len(shard), sha256_hex(shard)))
        offset += len(shard)
    return b"".join(shards), ranges


def read_input_shard(store: ObjectStore, where: InputSlice) -> bytes:
    """A batch's input shard, verified: the whole object, or its range in a packed object.

    Raises:
        StoreError, ChecksumMismatch: as ``ObjectStore.get`` / ``get_range``.
    """
    if where.offset is None:
        return store.get(where.key)
    assert where.length is not None and where.sha256 is not None  # the ledger's check constraint
    return store.get_range(where.key, where.offset, where.length, sha256=where.sha256)


def decode_packed(data: bytes) -> Iterator[dict[str, Any]]:
    """The rows of every shard of a packed input object (or of a single shard), in order.

    For whole-object readers (tests, tools); a worker reads its own range instead.

    Raises:
        ShardError: as ``decode_shard``, for any of the frames.
    """
    rest = data
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        try:
            frame.decompress(rest)
        except zstandard.ZstdError as e:
            raise ShardError(f"corrupt packed object at byte {len(data) - len(rest)}: {e}") from e
        if not frame.eof:
            raise ShardError(f"truncated packed object: its last frame ends early ({len(data)} bytes read)")
        used = len(rest) - len(frame.unused_data)
        yield from decode_shard(rest[:used])
        rest = rest[used:]


def _parse_line(line: bytes, line_number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise ShardError(f"line {line_number} of shard is not valid JSON: {e}") from e
    if not isinstance(row, dict):
        raise ShardError(f"line {line_number} of shard is a {type(row).__name__}, not an object")
    return row


def _batch_file(seq: int) -> str:
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise ValueError(f"batch sequence number must be a non-negative int, got {seq!r}")
    return f"batch-{seq:06d}.jsonl.zst"


def input_shard_url(output_url: str, seq: int) -> str:
    """``<output>/inputs/batch-{seq:06d}.jsonl.zst``: the rows of batch ``seq``."""
    return join_key(output_url, "inputs", _batch_file(seq))


def input_group_url(output_url: str, first_seq: int) -> str:
    """``<output>/inputs/group-{first_seq:06d}.jsonl.zst``: the packed input shards of a submit's group.

    Named by its first batch: seqs are never reused, so a rerun of a crashed submit
    overwrites the group object nothing references yet, never one the ledger names.
    """
    return join_key(output_url, "inputs", f"group-{_batch_file(first_seq)[len('batch-'):]}")


def output_shard_url(output_url: str, seq: int) -> str:
    """``<output>/outputs/batch-{seq:06d}.jsonl.zst``: the generations of batch ``seq``."""
    return join_key(output_url, "outputs", _batch_file(seq))


def run_manifest_url(output_url: str) -> str:
    """``<output>/run.json``: the run's manifest."""
    return join_key(output_url, "run.json")


def encode_manifest(run: Any) -> bytes:
    """The run's manifest (``run_manifest_url``): what was asked and recorded, beside its shards (docs/formats.md).

    ``run`` is a ledger.runs.RunRecord, not imported here: ledger/runs.py imports this module.
    """
    return json.dumps({"run": run.name, "model": run.model, "sampling": run.sampling, "benchmark": run.benchmark,
                       "config_hash": run.config_hash, "provenance": run.provenance,
                       "created_at": run.created_at.isoformat() if run.created_at else None},
                      indent=2, sort_keys=True).encode()
