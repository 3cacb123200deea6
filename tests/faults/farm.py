"""A small farm for fault tests: env, worker flags tuned for fast recovery, dataset builders."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import text

#: Leases and reconciler passes in seconds instead of minutes, so recovery fits in a test.
FAST_RECOVERY = ["--lease-s", "8", "--heartbeat-s", "2", "--reconcile-s", "3", "--requeue-grace-s", "5",
                 "--max-attempts", "2"]


def write_prompts(path: Path, n: int, *, prefix: str, long_every: int = 0) -> set[str]:
    """n single-turn prompts; every ``long_every``-th one is longer than the model's context."""
    ids = set()
    with path.open("w") as f:
        for i in range(n):
            sid = f"{prefix}{i:04d}"
            content = f"tell me a long story about the number {i}"
            if long_every and i % long_every == 0:
                content = "long " * 12000
            f.write(json.dumps({"id": sid, "messages": [{"role": "user", "content": content}]}) + "\n")
            ids.add(sid)
    return ids


def batches_by_status(sessions, run: str) -> dict[str, int]:
    with sessions() as s:
        return dict(s.execute(text(
            "SELECT b.status, count(*) FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = :n "
            "GROUP BY b.status"), {"n": run}).all())


def running_on(sessions, run: str, worker_prefix: str) -> int:
    with sessions() as s:
        return s.execute(text(
            "SELECT count(*) FROM batches b JOIN runs r ON r.id = b.run_id WHERE r.name = :n "
            "AND b.status = 'running' AND b.worker LIKE :w"), {"n": run, "w": f"%@{worker_prefix}"}).scalar()


def settled(sessions, run: str) -> bool:
    """Nothing pending or running: every batch done or dead."""
    counts = batches_by_status(sessions, run)
    return bool(counts) and set(counts) <= {"done", "dead"}
