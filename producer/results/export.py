"""``regen export``: a run's committed samples as training data, deterministic and sharded.

Output directory::

    OUT/manifest.json                          counts, filters, the split, what was left out and why
    OUT/data/train-00000-of-00004.parquet      --format messages: one row per sample
    OUT/data/train-00000-of-00004.jsonl        --format tokens: one row per generation event
    OUT/train/, OUT/eval/                      instead of data/ with --eval-share (export_split.py)
    OUT/stats/train-00000-of-00004.token_counts.parquet, OUT/stats/token_counts.parquet
                                               loss-mask tokens by id, training side (token_stats.py)
    OUT/vocab/                                 --draft-vocab N: d2t/t2d for SpecForge and speculators

The data files sit in ``data/`` so a consumer pointed at that directory (``speculators
prepare-data --data OUT/data``) never mistakes the manifest for data. Rows are sorted
by sample id (then turn) across all shards, so the same ledger exports to the same
bytes. Bad quality classes are left out unless ``include``/``include_all`` keep them.

Memory stays flat whatever the run's size (bench/export_scale.py measures it at 1M and 10M
samples):

1. the plan (export_plan.py) streams the ledger's committed samples in sample-id order and
   writes each kept sample's export shard into bucket files on disk;
2. the output shards are read a bucket at a time, each once, and their rows appended to a
   spill file per export shard;
3. each spill file is sorted (keys and file offsets in memory, not rows) and written.

Disk use peaks at twice the export's size (plus the plan's ~60 bytes a sample).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ledger.errors import ConfigError, ShardError
from ledger.objects import ObjectStore
from ledger.quality import BAD_CLASSES, CLASSES, Quality
from ledger.runs import RunRecord, find_run

from . import draft_vocab as vocab
from . import token_stats as stats
from .export_plan import FAKE, ExportPlan, OutputShard
from .export_rows import load_decoder, message_row, messages_schema, token_rows
from .export_split import EVAL, RULE, TRAIN, check_eval_share
from .outputs import FAKE_ROWS_WHY, is_fake_row, read_shards, row_quality, sample_status_counts

FORMATS = ("messages", "tokens")
#: Rows per shard. Messages: ~10K conversations is a few hundred MB of Parquet. Tokens: a
#: row holds its whole context as ids (32K ids are ~200 KB of JSON), so fewer per file.
DEFAULT_SHARD_ROWS = {"messages": 10_000, "tokens": 2_000}
DATA_DIR = "data"
MANIFEST_FILE = "manifest.json"
#: Seconds between two progress lines while output shards are read (and one after the last).
PROGRESS_EVERY_S = 10.0
_SUFFIX = {"messages": "parquet", "tokens": "jsonl"}


@dataclass(frozen=True)
class Manifest:
    path: Path
    data: dict[str, Any]

    @property
    def files(self) -> list[Path]:
        return [self.path.parent / shard["path"] for shard in self.data["shards"]]

    def files_of(self, side: str) -> list[Path]:
        """The data files of one side of the split (``train`` or ``eval``)."""
        return [self.path.parent / shard["path"] for shard in self.data["shards"] if shard["split"] == side]


@dataclass
class _Tally:
    """What was exported and what was left out, counted while reading."""

    left_out: Counter = field(default_factory=Counter)
    exported: Counter = field(default_factory=Counter)
    per_run: Counter = field(default_factory=Counter)


def export_run(sessions: sessionmaker[Session], store: ObjectStore, run_names: list[str], fmt: str,
               out_dir: str | Path, include_all: bool = False, include: tuple[str, ...] | list[str] = (),
               shard_rows: int | None = None, tokenizer: str | None = None, eval_share: float = 0.0,
               split_seed: int | None = None, draft_vocab: int | None = None,
               progress: Callable[[str], None] | None = None) -> Manifest:
    """Export the committed samples of ``run_names`` (one config hash) into ``out_dir``.

    Args:
        fmt: ``messages`` (Parquet) or ``tokens`` (speculators boundary rows, JSONL).
        out_dir: Created if missing; must be empty.
        include_all: Keep every class (failed samples still have nothing to export).
        include: Bad classes to keep besides ``ok``.
        shard_rows: Rows per data file (default ``DEFAULT_SHARD_ROWS[fmt]``).
        tokenizer: tokenizer.json (or its directory) for ``text`` in the tokens format,
            when the run's model path does not exist here; its folder's config.json gives
            ``draft_vocab`` the target's vocabulary size.
        eval_share: Share of the samples held out in ``eval/`` (0: no split, files in ``data/``).
        split_seed: Seed of the split's hash (default: the first run's sampling seed).
        draft_vocab: Write d2t/t2d mappings for a draft vocabulary of this many tokens.
        progress: gets a line every PROGRESS_EVERY_S while the output shards are read (``regen export``
            prints them: an export of a large run reads for minutes).

    Raises:
        ConfigError: unknown format or class, a non-empty ``out_dir``, runs with different
            config hashes, no tokenizer for a tokens export, an eval share outside [0, 1),
            a draft vocabulary without torch, config.json, or smaller than the target's.
        ChecksumMismatch, ShardError, StoreError: a committed output shard cannot be read as recorded.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    unknown = sorted(set(include) - set(CLASSES))
    if unknown:
        raise ConfigError(f"--include: unknown class(es) {unknown}; classes: {', '.join(CLASSES)}")
    rows_per_shard = DEFAULT_SHARD_ROWS[fmt] if shard_rows is None else shard_rows
    if rows_per_shard < 1:
        raise ConfigError("--shard-size must be at least 1")
    if not run_names or len(set(run_names)) != len(run_names):
        raise ConfigError("name each run to export once")
    check_eval_share(eval_share)
    if draft_vocab is not None:
        vocab.check_can_write()
    kept = set(CLASSES) if include_all else {Quality.OK.value, *include}
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: export into a new directory")

    with sessions() as session:
        runs = [find_run(session, name) for name in run_names]
        hashes = {run.config_hash for run in runs}
        if len(hashes) > 1:
            listing = ", ".join(f"{run.name}={run.config_hash[:12]}" for run in runs)
            raise ConfigError(f"runs with different configurations cannot be exported together ({listing}): "
                              "their samples come from different models or sampling")
    decode = source = None
    if fmt == "tokens":
        decode, source = load_decoder(runs[0].model, tokenizer)
    target = vocab.target_vocab_size(runs[0].model, tokenizer) if draft_vocab is not None else None
    if target is not None:
        vocab.check_size(draft_vocab, target[0])
    # Runs exported together share a config hash, hence their sampling and its seed.
    seed = int(runs[0].sampling.get("seed", 0)) if split_seed is None else int(split_seed)
    dirs = {TRAIN: TRAIN, EVAL: EVAL} if eval_share > 0 else {TRAIN: DATA_DIR}

    out.mkdir(parents=True, exist_ok=True)
    spill = out / ".spill"
    spill.mkdir()
    tally = _Tally()
    try:
        with sessions() as session:
            # One snapshot: the samples counted by status are the ones the plan places or leaves out.
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            statuses = [sample_status_counts(session, run.id) for run in runs]
            samples = sum(sum(s.values()) for s in statuses)
            plan = ExportPlan.build(session, [run.id for run in runs], spill, fmt=fmt, kept=kept,
                                    expected_samples=samples, rows_per_shard=rows_per_shard, seed=seed,
                                    eval_share=eval_share, left_out=tally.left_out)
        tally.left_out["not_committed"] = samples - sum(plan.committed.values())
        said = started = time.monotonic()
        done = 0
        for bucket in plan.output_shards():
            fetched = read_shards(store, [(shard.url, shard.sha256) for shard in bucket])
            for shard, (_url, rows) in zip(bucket, fetched, strict=True):
                _spill_rows(spill, fmt, runs, shard, rows, kept, decode, tally)
                done += 1
                if progress is not None and (time.monotonic() - said >= PROGRESS_EVERY_S
                                             or done == plan.n_output_shards):
                    said = time.monotonic()
                    progress(f"{done:,}/{plan.n_output_shards:,} output shards read, "
                             f"{sum(tally.exported.values()):,} samples kept, "
                             f"{sum(tally.left_out.values()):,} left out, {said - started:.0f} s")
        shards, totals = _write_shards(out, spill, fmt, plan.n_shards, dirs)
        total_ids, total_counts = totals.pairs()
        token_total = stats.write_counts(out / stats.STATS_DIR / stats.TOTAL_FILE, total_ids, total_counts)
        mapping = None if target is None else vocab.write_mappings(out, total_ids, total_counts, draft_vocab,
                                                                   *target)
    except BaseException:
        # Leave OUT empty, so the same command can simply be run again.
        for child in out.iterdir():
            if child != spill:
                shutil.rmtree(child, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    exported = tally.exported

    manifest = {
        "format": fmt,
        "config_hash": runs[0].config_hash,
        "model": runs[0].model,
        "runs": [{"name": run.name, "status": run.status, "benchmark": run.benchmark, "samples": statuses[n],
                  "committed": plan.committed[n], "exported_samples": tally.per_run[n]} for n, run in enumerate(runs)],
        # Always present, so a consumer can assert it: the fake engine's rows found and left out.
        "fake_rows_left_out": tally.left_out[FAKE],
        "filters": {"include_all": include_all, "include": sorted(include),
                    "kept_classes": [c for c in CLASSES if c in kept and c != Quality.FAILED.value],
                    "excluded_classes": [c for c in BAD_CLASSES if c not in kept]},
        "counts": {"samples": sum(exported.values()), "rows": sum(s["rows"] for s in shards),
                   "shards": len(shards), "samples_by_class": {c: exported[c] for c in CLASSES if exported[c]}},
        "split": None if eval_share <= 0 else {
            "eval_share": eval_share, "seed": seed, "seed_from": "run sampling" if split_seed is None else "--split-seed",
            "rule": RULE, **{side: {"samples": sum(s["samples"] for s in shards if s["split"] == side),
                                    "rows": sum(s["rows"] for s in shards if s["split"] == side),
                                    "shards": sum(s["split"] == side for s in shards), "dir": dirs[side]}
                             for side in (TRAIN, EVAL)}},
        "token_stats": {"counted": "completion tokens under the loss mask (completed generations), by token id, "
                                   "training side only",
                        "format": "Parquet, columns token_id (int64) and count (int64), sorted by token_id",
                        "total": token_total},
        "draft_vocab": mapping,
        "left_out": _left_out(tally.left_out, fmt),
        "shards": shards,
        "tokenizer": source,
        "sorted_by": "sample_id" if fmt == "messages" else "primary_id, turn",
    }
    path = out / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return Manifest(path, manifest)


def _spill_rows(spill: Path, fmt: str, runs: list[RunRecord], shard: OutputShard, rows: list[dict],
                kept: set[str], decode, tally: _Tally) -> None:
    """Turn the wanted rows of one output shard into export rows, appended to their shards' spill files."""
    wanted = shard.wanted
    lines: dict[tuple[str, int], list[dict]] = defaultdict(list)
    counted: dict[int, list[int]] = defaultdict(list)
    found = 0
    for row in rows:
        want = wanted.get(row.get("sample_id"))
        if want is None or row.get("status") != "done":
            continue
        found += 1
        if is_fake_row(row):
            tally.left_out[FAKE] += 1  # a fake row the ledger did not mark (committed before migration 0010)
            continue
        run = runs[want.run]
        sample_class, details = row_quality(row, run.thresholds)
        sample_class = want.quality or sample_class  # the ledger's class is the one status and gate saw
        if sample_class not in kept:
            tally.left_out[sample_class] += 1
            continue
        tally.exported[sample_class] += 1
        tally.per_run[want.run] += 1
        key = (want.side, want.shard)
        if want.side == TRAIN:
            counted[want.shard].extend(stats.completion_ids(row))
        if fmt == "messages":
            lines[key].append(message_row(row, run=run.name, sample_class=sample_class))
            continue
        token, failed = token_rows(row, run=run.name, run_seed=int(run.sampling.get("seed", 0)),
                                   sample_class=sample_class, turn_classes=[d["quality"] for d in details])
        tally.left_out["failed_generation"] += failed
        lines[key].extend(token)
    if found != len(wanted):
        raise ShardError(f"{shard.url} lacks {len(wanted) - found} of the done samples the ledger places in it")
    if fmt == "tokens":
        batch = [r for shard_rows in lines.values() for r in shard_rows]
        for r, text in zip(batch, decode([r["input_ids"] for r in batch]), strict=True):
            r["text"] = text
    for shard, ids in counted.items():
        stats.append_counts(spill / f"{TRAIN}-{shard:06d}.counts", ids)
    for (side, shard), records in lines.items():
        with open(spill / f"{side}-{shard:06d}.jsonl", "a", encoding="utf-8") as f:
            # "<sort key>\t<row>": pass 2 sorts on the small key and copies the row's JSON as it
            # is (serialising long id lists dominates a tokens export). JSON escapes every tab.
            f.writelines(json.dumps(_sort_key(fmt, r), ensure_ascii=False) + "\t" + json.dumps(r, ensure_ascii=False)
                         + "\n" for r in records)


def _sort_key(fmt: str, record: dict[str, Any]) -> list:
    if fmt == "messages":
        return [record["sample_id"]]
    return [record["primary_id"], record["metadata"]["turn"]]


def _write_shards(out: Path, spill: Path, fmt: str, n_shards: dict[str, int], dirs: dict[str, str]
                  ) -> tuple[list[dict[str, Any]], stats.Totals]:
    """Sort each spill file and write the data files (and a training file's token counts), named once
    their number is known. One export shard in memory at a time, its rows' sort keys and offsets."""
    totals = stats.Totals()
    shards = []
    for side in (TRAIN, EVAL):
        if side not in dirs:
            continue
        data = out / dirs[side]
        data.mkdir()
        written: list[tuple[Path, dict[str, Any], Path | None]] = []
        for shard in range(n_shards[side]):
            path = spill / f"{side}-{shard:06d}.jsonl"
            if not path.exists():
                continue  # every sample of this shard was left out while reading (unclassified rows)
            order = _sorted_rows(path)
            target = data / f".part-{shard:06d}"
            _write_file(target, fmt, path, order)
            entry = {"split": side, "rows": len(order), "samples": len({key[0] for key, _, _ in order})}
            counts_part = None
            if side == TRAIN:
                ids, counts = stats.reduce_counts(spill / f"{side}-{shard:06d}.counts")
                totals.add(ids, counts)
                counts_part = out / stats.STATS_DIR / f".part-{shard:06d}"
                entry["token_counts"] = stats.write_counts(counts_part, ids, counts)
            written.append((target, entry, counts_part))
        for n, (target, entry, counts_part) in enumerate(written):
            final = data / f"{side}-{n:05d}-of-{len(written):05d}.{_SUFFIX[fmt]}"
            target.rename(final)
            with open(final, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            entry = {"path": f"{dirs[side]}/{final.name}", **entry, "sha256": digest}
            if counts_part is not None:
                counts_final = counts_part.with_name(final.name.split(".")[0] + stats.SUFFIX)
                counts_part.rename(counts_final)
                entry["token_counts"]["path"] = f"{counts_final.parent.name}/{counts_final.name}"
                entry["token_counts"] = entry.pop("token_counts")  # after sha256, as before
            shards.append(entry)
    return shards, totals


def _sorted_rows(path: Path) -> list[tuple[list, int, int]]:
    """``(sort key, offset, length)`` of each row of a spill file, in the export's order: the rows
    themselves stay on disk (a tokens shard's rows are hundreds of MB)."""
    order = []
    offset = 0
    with open(path, "rb") as f:
        for line in f:
            tab = line.index(b"\t")  # JSON escapes every tab inside the key and the row
            order.append((json.loads(line[:tab]), offset + tab + 1, len(line) - tab - 1))
            offset += len(line)
    order.sort(key=lambda item: item[0])
    return order


def _write_file(path: Path, fmt: str, spill_file: Path, order: list[tuple[list, int, int]]) -> None:
    """Write one data file from its spill file's rows, in ``order`` (each row's JSON with its newline)."""
    with open(spill_file, "rb") as spilled:
        def rows():
            for _key, offset, length in order:
                spilled.seek(offset)
                yield spilled.read(length)

        if fmt == "messages":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pylist([json.loads(row) for row in rows()], schema=messages_schema())
            pq.write_table(table, path, compression="zstd")
            return
        with open(path, "wb") as f:
            f.writelines(rows())


def _left_out(counts: Counter, fmt: str) -> dict[str, Any]:
    why = {
        Quality.FAILED.value: "failed samples have no output (regen status shows their reasons)",
        "not_committed": "pending, or in a batch the ledger does not mark done",
        "duplicate_sample_id": "the same sample id in an earlier-named run (exported from there)",
        FAKE: FAKE_ROWS_WHY,
    }
    samples = {}
    for name in (*CLASSES, "not_committed", "duplicate_sample_id", FAKE):
        if counts[name]:
            samples[name] = {"count": counts[name], "why": why.get(
                name, f"quality class {name}, left out by default: --include {name} or --include-all keeps it")}
    out: dict[str, Any] = {"samples": samples}
    if fmt == "tokens":
        out["generations"] = {"failed_generation": {
            "count": counts["failed_generation"],
            "why": "a generation that did not complete (finish_reason not stop/length, or no completion ids)"}}
    return out
