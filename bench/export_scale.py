"""``regen export``'s peak memory and time at 1M and 10M samples, the code before and after issue 58 (item 7).

    python -m bench.export_scale --before b98e4e8^ --samples 1000000,10000000

For each size: a scratch ledger (this tree's migrations) holding one finished run of that many
committed samples, batches of ``--batch-size``, and their output shards in a moto S3 server;
then the same ``export_run`` (messages format, the defaults) twice, each in a child process of
its own: once with the ``--before`` revision's packages first on ``PYTHONPATH`` (unpacked from
git), once with this tree's. Each child reports its wall time and its peak RSS
(``ru_maxrss``), and the two exports' data files must be byte-identical (their sha256s are
compared). One table, the two sides in columns and their ratio.

The rows are small (one turn, ~40 completion tokens) so that 10M of them fit moto's memory: the
export's own per-sample state is what grows with the run, not the rows, which are bounded by
the export shard's size either way. Everything it creates is dropped at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import psycopg
import zstandard

from bench.scratch import DEFAULT_ADMIN_DSN, scratch_services
from ledger.quality import Thresholds, classify_sample
from ledger.shards import ZSTD_LEVEL

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ledger", "producer", "worker", "migrations")
RUN = "export-scale"

# --- the child: one export, measured -------------------------------------------------------------------

_CHILD = r"""
import json, resource, sys, time
from sqlalchemy.orm import sessionmaker
from ledger.db import make_engine
from ledger.objects import ObjectStore
from ledger.settings import Settings
from producer.results.export import export_run

database_url, out = sys.argv[1], sys.argv[2]
engine = make_engine(Settings(database_url=database_url, redis_url="redis://127.0.0.1:6379/0"))
started = time.monotonic()
manifest = export_run(sessionmaker(engine), ObjectStore(), [sys.argv[3]], "messages", out)
print(json.dumps({"wall_s": time.monotonic() - started,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "samples": manifest.data["counts"]["samples"],
                  "files": [s["sha256"] for s in manifest.data["shards"]]}))
"""


def _export(code_root: str, database_url: str, out: str, env: dict[str, str]) -> dict:
    # In code_root: `python -c` puts the working directory first on sys.path, ahead of PYTHONPATH.
    path = os.pathsep.join(p for p in (code_root, str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", _CHILD, database_url, out, RUN], env={**env, "PYTHONPATH": path},
                          cwd=code_root, capture_output=True, text=True, check=False)
    if Path(code_root).resolve() != ROOT:
        imported = subprocess.run([sys.executable, "-c", "import producer.results.export as e; print(e.__file__)"],
                                  env={**env, "PYTHONPATH": path}, cwd=code_root, capture_output=True, text=True,
                                  check=True).stdout.strip()
        assert imported.startswith(str(Path(code_root).resolve())), f"the before side imported {imported}"
    if done.returncode != 0:
        raise SystemExit(f"export under {code_root} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the run: ledger rows by SQL, output shards from one template ----------------------------------------


def sample_id(i: int) -> str:
    """A content-hash-like id, the same as the ledger's ``md5(i::text)``: scattered over the sort order."""
    return hashlib.md5(str(i).encode()).hexdigest()


def _template() -> bytes:
    """One output row (a thinking turn and its answer) as a shard's JSON line, its id a placeholder."""
    prompt, completion = list(range(100, 120)), list(range(200, 240))
    row = {"sample_id": "@ID@", "source": {"file": "bench.jsonl", "row": 0},
           "input_messages": [{"role": "user", "content": "What is the capital of France?"}], "tools": None,
           "thinking": True, "model": "bench", "status": "done", "error": None,
           "messages": [{"role": "user", "content": "What is the capital of France?"},
                        {"role": "assistant", "reasoning_content": "The user asks about France; Paris.",
                         "content": "Paris is the capital of France."}],
           "events": [{"turn": 0, "message_index": 1, "prompt_token_ids": prompt, "completion_token_ids": completion,
                       "loss_mask": [0] * len(prompt) + [1] * len(completion), "finish_reason": "stop",
                       "engine_stop_reason": 2, "is_tool_call": False, "reasoning_tokens": 30, "answer_tokens": 9,
                       "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
                       "tool_call_errors": [], "truncated_in_reasoning": False, "think_tags_ok": True}],
           "finish_reason": "stop", "stop_reason": None, "turns": 1, "tool_calls": 0,
           "usage": {"prompt_tokens": 20, "completion_tokens": 40, "reasoning_tokens": 30, "answer_tokens": 9}}
    # Classified as the worker stores it (a class, and each turn's detail), so the export reads it.
    row["quality"], details = classify_sample(row, Thresholds())
    for event, detail in zip(row["events"], details, strict=True):
        event["quality"] = detail
    return json.dumps(row, separators=(",", ":")).encode() + b"\n"


def build_run(dsn: str, bucket: str, samples: int, batch_size: int) -> None:
    """One finished run of ``samples`` committed samples: shards uploaded, batches and samples inserted."""
    import boto3

    s3 = boto3.session.Session().client("s3")
    template = _template().split(b"@ID@")
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, write_checksum=True)
    n_batches = -(-samples // batch_size)
    with psycopg.connect(dsn, autocommit=True) as conn:
        run = conn.execute(
            "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status, provenance) "
            "VALUES (%s, 'bench', '{\"seed\": 7}', %s, %s, 'regen', %s, 'finished', '{}') RETURNING id",
            (RUN, "b" * 64, f"s3://{bucket}/{RUN}", batch_size)).fetchone()[0]
        with conn.cursor().copy("COPY batches (run_id, seq, status, attempts, input_key, output_key, output_sha256, "
                                "n_samples, finished_at) FROM STDIN") as copy:
            for seq in range(n_batches):
                first, last = seq * batch_size, min(samples, (seq + 1) * batch_size)
                data = compressor.compress(b"".join(template[0] + sample_id(i).encode() + template[1]
                                                    for i in range(first, last)))
                key = f"{RUN}/outputs/batch-{seq:06d}.jsonl.zst"
                s3.put_object(Bucket=bucket, Key=key, Body=data)
                copy.write_row((run, seq, "done", 1, f"s3://{bucket}/{RUN}/inputs/{seq}", f"s3://{bucket}/{key}",
                                hashlib.sha256(data).hexdigest(), last - first, "2026-12-07T00:00:00Z"))
        conn.execute(
            "INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status, finish_reason, turns, "
            "prompt_tokens, completion_tokens, reasoning_tokens, answer_tokens, tool_calls, output_key, quality) "
            "SELECT b.run_id, md5(i::text), b.id, 'bench.jsonl', i, 'done', 'stop', 1, 20, 40, 30, 9, 0, b.output_key, "
            "'ok' FROM batches b, generate_series(b.seq * %s, b.seq * %s + b.n_samples - 1) i WHERE b.run_id = %s",
            (batch_size, batch_size, run))
        conn.execute("ANALYZE samples; ANALYZE batches")


def _unpack(revision: str, into: str) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", revision, *PACKAGES],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="b98e4e8^", help="git revision of the export to compare with")
    parser.add_argument("--samples", default="1000000,10000000", help="run sizes, comma-separated")
    parser.add_argument("--batch-size", type=int, default=1024, help="samples per output shard")
    parser.add_argument("--admin-dsn", default=DEFAULT_ADMIN_DSN)
    args = parser.parse_args()
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], check=True,
                              capture_output=True, text=True).stdout.strip()
    results = []
    with tempfile.TemporaryDirectory(prefix="regen-before-") as before_root:
        _unpack(revision, before_root)
        for samples in (int(n) for n in args.samples.split(",")):
            with scratch_services(admin_dsn=args.admin_dsn, prefix="regen_bench_export") as scratch:
                started = time.monotonic()
                build_run(scratch.settings.database_url, scratch.bucket, samples, args.batch_size)
                print(f"{samples:,} samples: ledger and shards built in {time.monotonic() - started:.0f} s", flush=True)
                sides = {}
                for side, root in (("before", before_root), ("after", str(ROOT))):
                    out = os.path.join(scratch.workdir, f"out-{side}")
                    sides[side] = _export(root, scratch.settings.database_url, out, scratch.env())
                    print(f"  {side}: {json.dumps({k: v for k, v in sides[side].items() if k != 'files'})}",
                          flush=True)
                    subprocess.run(["rm", "-rf", out], check=True)
                if sides["before"]["files"] != sides["after"]["files"]:
                    raise SystemExit(f"{samples:,} samples: the two exports differ")
                results.append((samples, sides))
    print(f"\nregen export (messages), one run of N committed samples in batches of {args.batch_size:,}: "
          f"before = {revision}, after = this tree; data files byte-identical on both sides")
    print(f"{'':34} {'before':>12} {'after':>12} {'after/before':>13}")
    for samples, sides in results:
        for key, label, unit in (("wall_s", "wall time", "s"), ("peak_rss_mb", "peak RSS", "MB")):
            b, a = sides["before"][key], sides["after"][key]
            print(f"{f'{samples:>11,} samples, {label}':34} {b:>10.1f}{unit:>2} {a:>10.1f}{unit:>2} {a / b:>12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
