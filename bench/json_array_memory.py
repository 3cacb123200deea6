"""Peak RSS of reading and normalising a ShareGPT JSON array, against ``json.load`` of the same file.

    .venv/bin/python -m bench.json_array_memory --conversations 100000

Writes a ``.json`` array of ShareGPT conversations (4 turns, ~1 KB of text each) to a
temporary folder, then, in a fresh process each, (a) reads it with regen's readers and
normalises every row, as submit does, and (b) ``json.load``-s it, the way a whole-file
reader would. Each prints its peak RSS (getrusage) and how long it took.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_WORDS = "the quick brown fox jumps over the lazy dog and keeps on running through the field "


def write_array(path: Path, conversations: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write("[\n")
        for i in range(conversations):
            turns = [{"from": "human" if t % 2 == 0 else "gpt", "value": f"{i}.{t} " + _WORDS * 3}
                     for t in range(4)]
            f.write(("," if i else "") + json.dumps({"id": f"conv-{i}", "conversations": turns}) + "\n")
        f.write("]\n")


def _measure(mode: str, path: str) -> None:
    start = time.perf_counter()
    if mode == "regen":
        from producer.dataset.normalize import normalize_row
        from producer.dataset.readers import iter_rows

        rows = sum(1 for raw in iter_rows([path]) if raw.obj is not None and normalize_row(raw.obj))
    else:
        with open(path, encoding="utf-8") as f:
            rows = len(json.load(f))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"mode": mode, "rows": rows, "peak_rss_mb": round(peak_mb, 1),
                      "seconds": round(time.perf_counter() - start, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--measure", choices=["regen", "json.load"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure(args.measure, args.path)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sharegpt.json"
        write_array(path, args.conversations)
        print(f"{args.conversations:,} conversations, {path.stat().st_size / 2**20:.0f} MB")
        for mode in ("regen", "json.load"):
            subprocess.run([sys.executable, "-m", "bench.json_array_memory", "--measure", mode, "--path", str(path)],
                           check=True)


if __name__ == "__main__":
    main()
