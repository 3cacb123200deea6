"""Issue 4's acceptance run: a node crashes, another is preempted, Redis is flushed, a new node joins.

Every sample must end done exactly once: none lost, none twice in the ledger or in
the output shards the ledger points to.
"""

from __future__ import annotations

import signal
import time

import pytest
import redis as redis_lib

from tests.faults.farm import FAST_RECOVERY, batches_by_status, running_on, settled, write_prompts
from tests.fixtures.fault_report import account
from tests.support.helpers import cli_env, run_cli, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_sigkill_sigterm_redis_flush_and_a_new_worker_lose_nothing(settings, s3_env, s3_bucket, sessions,
                                                                    start_worker, tmp_path, fault_report):
    env = cli_env(settings, s3_env)
    expected = write_prompts(tmp_path / "chaos.jsonl", 240, prefix="c")
    a = start_worker("a", concurrency=4, extra=FAST_RECOVERY)
    b = start_worker("b", concurrency=4, extra=FAST_RECOVERY)
    # Submitted while the engines load, so the batches wait for the workers rather than the test for
    # its submit: run after both were ready, the submit (a CLI process) once came back on a loaded
    # machine after both workers had finished the whole run (30 small batches), and there was
    # nothing left to kill mid-batch.
    run_cli(["submit", str(tmp_path / "chaos.jsonl"), "--run", "chaos", "--model", a.model, "--output",
             f"{s3_bucket}/chaos", "--batch-size", "8", "--max-tokens", "256", "--seed", "3",
             # Random weights are all truncation; the quality gate is tested elsewhere.
             "--quality-thresholds", '{"gate_overridden": true}'], env)
    a.wait_ready()
    b.wait_ready()
    logs = lambda: "\n".join(w.name + ":\n" + w.log()[-2500:] for w in (a, b))  # noqa: E731

    # 1. Node crash: every process of worker a dies at once, mid-batch.
    wait_for(lambda: running_on(sessions, "chaos", "a") >= 2, timeout_s=180, what="a running batches",
             interval_s=0.2, on_timeout=logs)
    a.kill_all()

    # 2. Preemption: b gets SIGTERM and must hand its batches back within seconds, then exit.
    wait_for(lambda: running_on(sessions, "chaos", "b") >= 1, timeout_s=120, what="b running batches",
             interval_s=0.2, on_timeout=logs)
    t0 = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: running_on(sessions, "chaos", "b") == 0, timeout_s=30, what="b handing back its batches",
             interval_s=0.1, on_timeout=logs)
    handback_s = time.monotonic() - t0
    assert b.proc.wait(timeout=90) == 0
    assert handback_s < 10, f"preempted batches took {handback_s:.1f}s to go back"
    assert not [p for p in b.tree() if p.is_running()], "no engine process may outlive a stopped worker"

    # 3. Redis loses everything, and the queue is rebuilt from the ledger.
    redis_lib.Redis.from_url(settings.redis_url).flushdb()
    out = run_cli(["requeue", "--run", "chaos"], env).stdout
    assert "batches published" in out

    # 4. A new worker joins; its reconciler also takes over a's expired leases.
    c = start_worker("c", concurrency=4, extra=FAST_RECOVERY)
    c.wait_ready()
    wait_for(lambda: settled(sessions, "chaos"), timeout_s=900, what="every batch settled", interval_s=1,
             on_timeout=lambda: f"{batches_by_status(sessions, 'chaos')}\n{c.log()[-4000:]}")

    row = fault_report("SIGKILL a + SIGTERM b + FLUSHDB + join c", account(sessions, "chaos", expected_ids=expected))
    assert row.lost == 0 and row.dup_ledger == 0 and row.dup_outputs == 0
    assert row.done == row.expected == 240
    assert batches_by_status(sessions, "chaos") == {"done": 30}
