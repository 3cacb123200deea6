"""Build a submitted run for ledger-level fault tests (no engine): the real submit path."""

from __future__ import annotations

import json
from pathlib import Path

from ledger.dispatch import make_celery
from ledger.objects import ObjectStore
from producer.run_config import build_run_config
from producer.submit import submit_run


def write_dataset(path: Path, n: int, *, prefix: str = "s") -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"{prefix}{i:04d}", "messages": [
                {"role": "user", "content": f"question number {i}: what is {i} + {i}?"}]}) + "\n")
    return path


def submit(settings, sessions, tmp_path: Path, bucket: str, *, run: str = "r", n: int = 20, batch_size: int = 5,
           model: str = "tiny", max_tokens: int = 16):
    data = write_dataset(tmp_path / f"{run}.jsonl", n)
    config = build_run_config(model, max_tokens=max_tokens, seed=1)
    report = submit_run(sessions, make_celery(settings), ObjectStore(), [str(data)], run_name=run, config=config,
                        output_url=f"{bucket}/{run}", batch_size=batch_size, queue="regen")
    return report
