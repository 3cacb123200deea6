"""Arrow files, as Hugging Face ``datasets`` writes them with ``save_to_disk``.

``Dataset.save_to_disk(folder)`` writes ``data-00000-of-00001.arrow`` (Arrow IPC *stream*
format) beside ``dataset_info.json`` and ``state.json``; a ``DatasetDict`` writes one such
folder per split and a ``dataset_dict.json``. Those JSON files describe the dataset, they
hold no rows: a folder walk leaves them out (:data:`DATASETS_METADATA`). The Arrow files are
read one record batch at a time from a memory map, so only the batch in use is resident.
Rows are 0-based row indexes, as for Parquet (what ``dataset[i]`` shows).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from ledger.errors import InputRowError

from . import reasons

#: Files ``datasets.save_to_disk`` writes beside its Arrow files: metadata, never rows.
DATASETS_METADATA = frozenset({"dataset_info.json", "state.json", "dataset_dict.json"})


def is_datasets_metadata(path: Path) -> bool:
    """Whether ``path`` is one of ``save_to_disk``'s metadata files (its folder, or a split's, holds .arrow files)."""
    if path.name not in DATASETS_METADATA:
        return False
    folder = path.parent
    return any(folder.glob("*.arrow")) or any(folder.glob("*/*.arrow"))


def _batches(source: pa.MemoryMappedFile) -> Iterator[pa.RecordBatch]:
    try:
        reader = ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)  # not the stream format: the IPC file format ("Feather v2") is also .arrow
        file_reader = ipc.open_file(source)
        for i in range(file_reader.num_record_batches):
            yield file_reader.get_batch(i)
        return
    yield from reader


def iter_arrow(path: Path, file: str, columns: Collection[str] | None,
               short: Any) -> Iterator[tuple[int, dict | None, InputRowError | None]]:
    """``(row, object, error)`` for each row of an Arrow IPC file; an error ends the file."""
    row = 0
    try:
        with pa.memory_map(str(path)) as source:
            for batch in _batches(source):
                if columns is not None:
                    # As for Parquet: the fields the normaliser uses, so images and the like are never decoded.
                    batch = batch.select([c for c in batch.schema.names if c in columns])
                for obj in batch.to_pylist():
                    yield row, obj, None
                    row += 1
    except (pa.ArrowException, OSError) as e:
        yield row, None, InputRowError(reasons.UNREADABLE_FILE,
                                       f"not a readable Arrow file from row {row} on: {short(e)}")
