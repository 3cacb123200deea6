"""Stream the rows of a dataset's files, one JSON object at a time, never a whole file.

A bad row is data, not a crash: it comes out as a :class:`RawRow` carrying an
:class:`~ledger.errors.InputRowError`, so the submitter records it and goes on.
A file that cannot be read gives one ``unreadable_file`` row where reading
stopped (for Parquet, one per unreadable row group, and the other row groups are
still read); the other files are always read.

Forms: JSON lines (plain, ``.gz`` or ``.zst``), a ``.json`` file that is one JSON array
(json_array.py), Parquet, and the Arrow files of a ``datasets.save_to_disk`` folder
(arrow_files.py). A folder is read as one dataset: every such file in it, sorted.

Row numbers follow docs/CONTRACTS.md: JSONL rows are 1-based line numbers (what an
editor shows, blank lines counted); Parquet and Arrow rows and JSON array elements are
0-based indexes (what pandas, ``datasets`` and ``json.load(f)[i]`` show).
Files are named by their resolved path (``source.file``), so the same file submitted
from another folder, or through a symlink, is the same source.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import zlib
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from ledger.errors import ConfigError, InputRowError

from . import arrow_files, json_array, jsontext, reasons
from .normalize import INPUT_FIELDS

#: File name endings regen reads. A ``.json`` file is JSON lines (as the Hugging Face hub
#: serves them) or, when its first character is ``[``, one JSON array of rows (ShareGPT's form).
SUPPORTED_SUFFIXES = (".jsonl", ".json", ".jsonl.zst", ".json.zst", ".jsonl.gz", ".json.gz", ".parquet",
                      ".arrow")

#: What a corrupt or truncated compressed stream raises: zstandard's error, gzip's
#: BadGzipFile (an OSError), EOFError for a truncated gzip member, zlib's error.
_STREAM_ERRORS = (zstandard.ZstdError, OSError, EOFError, zlib.error)

#: Rows per Parquet batch. Conversations run from 1 KB to a few MB, so 1024 rows
#: keeps a batch in the megabytes while still amortising pyarrow's per-batch cost
#: (pyarrow's own default, 65536 rows, could be gigabytes of agent traces).
PARQUET_BATCH_ROWS = 1024

#: Bytes pyarrow reads from a Parquet column chunk at a time. Without it pyarrow
#: loads whole column chunks, and a file written as one row group (pandas does
#: that up to a million rows) would be read into memory entire.
PARQUET_BUFFER_BYTES = 1 << 20

#: Longest JSONL line read into memory, in bytes. Well above what the normaliser's
#: own limit (2M characters, up to 12 bytes each as \\u escapes) lets through, so
#: this only guards memory against a file that is not line-oriented at all.
MAX_LINE_BYTES = 64 << 20

#: Read-ahead of JSONL files, in bytes: fewer system calls than the 8 KiB default.
_READ_BUFFER_BYTES = 1 << 20

#: A detail never carries more than this many characters of a third-party message.
_MESSAGE_CHARS = 200

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class RawRow:
    """One row as read: either ``obj`` (a JSON object) or ``error``, never both.

    Attributes:
        file: the file's resolved path, for ``source.file``.
        row: 1-based line number (JSONL) or 0-based index (Parquet, Arrow, JSON array). For an
            ``unreadable_file`` error, the first row that could not be read (0
            when the file could not be opened at all).
    """

    file: str
    row: int
    obj: dict[str, Any] | None
    error: InputRowError | None


def _is_supported(path: Path) -> bool:
    return path.name.lower().endswith(SUPPORTED_SUFFIXES)


def iter_input_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Expand files and folders into the sorted list of input files.

    Folders are walked recursively for supported files; hidden files and folders
    (``.cache/``, macOS ``._x.parquet``) and ``save_to_disk``'s metadata files are
    skipped. The result is the files' resolved paths, sorted and de-duplicated, so
    neither the order of the arguments nor the folder they are named from changes
    which duplicate row wins or how a row is keyed.

    Raises:
        ConfigError: no paths, a path that does not exist, a named file of an
            unsupported type, or a folder with no supported file in it.
    """
    if not paths:
        raise ConfigError("no input paths given")
    found: dict[Path, None] = {}  # an ordered set
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files = [
                f for f in path.rglob("*")
                if f.is_file() and _is_supported(f)
                and not any(part.startswith(".") for part in f.relative_to(path).parts)
                and not arrow_files.is_datasets_metadata(f)
            ]
            if not files:
                raise ConfigError(f"{given}: folder holds no {', '.join(SUPPORTED_SUFFIXES)} file")
        elif path.is_file():
            if not _is_supported(path):
                raise ConfigError(f"{given}: unsupported file type; regen reads "
                                  f"{', '.join(SUPPORTED_SUFFIXES)}, and folders of them")
            files = [path]
        elif path.exists():
            raise ConfigError(f"{given}: not a regular file or folder")
        else:
            raise ConfigError(f"{given}: no such file or folder")
        found.update((f.resolve(), None) for f in files)
    return sorted(found, key=str)


def iter_rows(paths: Sequence[str | Path], *, columns: Collection[str] | None = INPUT_FIELDS,
              batch_rows: int = PARQUET_BATCH_ROWS) -> Iterator[RawRow]:
    """Every row of every input file, in :func:`iter_input_paths` order.

    Args:
        paths: files and folders, as given on the command line.
        columns: Parquet columns to read (those a file lacks are left out); None
            reads all. The default, the fields the normaliser uses, means a
            dataset's other columns (images, metadata) are never decoded.
        batch_rows: rows per Parquet batch.

    Raises:
        ConfigError: from :func:`iter_input_paths`, raised by this call itself
            (the paths are checked up front), not on the first row.
    """
    files = iter_input_paths(paths)
    return (row for path in files for row in iter_file_rows(path, columns=columns, batch_rows=batch_rows))


def iter_file_rows(path: Path, *, columns: Collection[str] | None = INPUT_FIELDS,
                   batch_rows: int = PARQUET_BATCH_ROWS) -> Iterator[RawRow]:
    """The rows of one file (see :func:`iter_rows`)."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        return _iter_parquet(path, columns, batch_rows)
    if name.endswith(".arrow"):
        file = str(path)
        return (RawRow(file, row, obj, error) for row, obj, error in arrow_files.iter_arrow(path, file, columns, _short))
    if name.endswith((".json", ".json.gz", ".json.zst")) and _starts_with_array(path):
        return _iter_json_array(path)
    return _iter_jsonl(path)


# --------------------------------------------------------------------------- JSONL

def _short(message: object) -> str:
    text = str(message)
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "..."


@contextlib.contextmanager
def _open_bytes(path: Path) -> Iterator[io.BufferedIOBase]:
    """The file's bytes, decompressed as its name says (``.gz``, ``.zst``), read ahead 1 MiB at a time."""
    with open(path, "rb", buffering=_READ_BUFFER_BYTES) as raw:
        name = path.name.lower()
        if name.endswith(".zst"):
            yield io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw),  # type: ignore[arg-type]
                                    buffer_size=_READ_BUFFER_BYTES)
        elif name.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield io.BufferedReader(unzipped, buffer_size=_READ_BUFFER_BYTES)  # type: ignore[arg-type]
        else:
            yield raw


def _stream_error(path: Path, e: BaseException) -> str:
    kind = "zstd" if path.name.lower().endswith(".zst") else "gzip" if path.name.lower().endswith(".gz") else "file"
    return f"{kind} stream is corrupt or truncated: {_short(e)}"


def _starts_with_array(path: Path) -> bool:
    """Whether the file's first character (after a BOM and whitespace) is ``[``."""
    try:
        with _open_bytes(path) as stream:
            chunk = stream.read(4096)
            head = chunk.removeprefix(_BOM).lstrip(b" \t\r\n")
            while chunk and not head:  # only whitespace so far
                chunk = stream.read(4096)
                head = chunk.lstrip(b" \t\r\n")
    except _STREAM_ERRORS:
        return False  # the JSONL reader reports the corrupt stream
    return head.startswith(b"[")


def _iter_json_array(path: Path) -> Iterator[RawRow]:
    file = str(path)
    index = 0
    try:
        with _open_bytes(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig") as text:
            for index, obj, error in json_array.iter_array(text, max_chars=MAX_LINE_BYTES):
                yield RawRow(file, index, obj, error)
    except UnicodeDecodeError as e:
        yield RawRow(file, index, None, InputRowError(
            reasons.INVALID_UTF8, f"the file is not valid UTF-8 (byte 0x{e.object[e.start]:02x}) at or after "
                                  f"element {index}; the rest of the file is not read"))
    except _STREAM_ERRORS as e:
        yield RawRow(file, index, None, InputRowError(reasons.UNREADABLE_FILE, _stream_error(path, e)))


def _iter_jsonl(path: Path) -> Iterator[RawRow]:
    file = str(path)
    with _open_bytes(path) as stream:
        readline = stream.readline
        lineno = 0
        loads = jsontext.loads
        while True:
            try:
                line = readline(MAX_LINE_BYTES + 1)
            except _STREAM_ERRORS as e:
                yield RawRow(file, lineno + 1, None, InputRowError(reasons.UNREADABLE_FILE, _stream_error(path, e)))
                return
            if not line:
                return
            lineno += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                # Skip the rest of the line without holding it.
                while line and not line.endswith(b"\n"):
                    line = readline(MAX_LINE_BYTES)
                yield RawRow(file, lineno, None,
                             InputRowError(reasons.TOO_LARGE, f"line is longer than {MAX_LINE_BYTES} bytes"))
                continue
            if lineno == 1 and line.startswith(_BOM):
                line = line[3:]
            # Also drops the newline, so an unterminated string is reported as such
            # rather than as a control character.
            line = line.strip()
            if not line:
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                yield RawRow(file, lineno, None, InputRowError(
                    reasons.INVALID_UTF8, f"byte 0x{line[e.start]:02x} at byte {e.start} of the line"))
                continue
            try:
                obj = loads(text)
            except json.JSONDecodeError as e:
                yield RawRow(file, lineno, None,
                             InputRowError(reasons.MALFORMED_JSON, f"column {e.colno}: {_short(e.msg)}"))
                continue
            except jsontext.LoneSurrogate as e:
                yield RawRow(file, lineno, None, InputRowError(reasons.INVALID_UTF8, str(e)))
                continue
            except ValueError as e:
                # NaN/Infinity, or nesting thousands deep, which no conversation has.
                yield RawRow(file, lineno, None, InputRowError(reasons.MALFORMED_JSON, _short(e)))
                continue
            if type(obj) is not dict:
                yield RawRow(file, lineno, None, InputRowError(
                    reasons.NOT_AN_OBJECT, f"line holds {jsontext.describe(obj)}, expected an object"))
                continue
            yield RawRow(file, lineno, obj, None)


# --------------------------------------------------------------------------- Parquet

#: What pyarrow raises on a corrupt or truncated file: ArrowInvalid and friends
#: (ArrowException), or OSError for I/O-level failures (ArrowIOError is one).
_PARQUET_ERRORS = (pa.ArrowException, OSError)


def _iter_parquet(path: Path, columns: Collection[str] | None, batch_rows: int) -> Iterator[RawRow]:
    file = str(path)
    row = 0
    try:
        pf = pq.ParquetFile(path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
    except _PARQUET_ERRORS as e:
        yield RawRow(file, 0, None, InputRowError(reasons.UNREADABLE_FILE, f"not a readable Parquet file: {_short(e)}"))
        return
    with pf:
        selected = None
        if columns is not None:
            # An empty selection still yields one (empty) dict per row, so a file
            # with none of the columns gets a per-row missing_field, like JSONL.
            selected = [c for c in pf.schema_arrow.names if c in columns]
        meta = pf.metadata
        # One row group at a time, so a corrupt one costs its own rows, not the rest of the file.
        for group in range(meta.num_row_groups):
            end = row + meta.row_group(group).num_rows
            batches = pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=selected)
            while True:
                try:
                    batch = next(batches, None)
                    if batch is None:
                        break
                    # Nested columns (lists of structs) become lists of dicts; a null
                    # struct or list becomes None, and so does a struct field a row
                    # does not use (the normaliser treats None as absent).
                    objs = batch.to_pylist()
                except _PARQUET_ERRORS as e:
                    yield RawRow(file, row, None, InputRowError(
                        reasons.UNREADABLE_FILE,
                        f"row group {group} (rows {row} to {end - 1}) cannot be read: {_short(e)}"))
                    break
                for obj in objs:
                    yield RawRow(file, row, obj, None)
                    row += 1
            row = end
