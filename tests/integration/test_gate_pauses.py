"""The failure this project exists to prevent: a run of stubs is paused by the gate, not finished.

A tiny model trained to answer everything with ``<think></think> OK.`` runs on a
real worker; the gate must pause the run while most of it is still pending, the
workers must stop generating it, and only a human's ``regen resume --force``
lets it continue.
"""

from __future__ import annotations

import json

import pytest

from tests.faults.farm import write_prompts
from tests.support.helpers import cli_env, run_cli, status_json, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_a_run_of_stubs_is_paused_by_the_gate_before_it_finishes(settings, s3_env, s3_bucket, start_worker,
                                                                 stub_model, tmp_path):
    env = cli_env(settings, s3_env)
    write_prompts(tmp_path / "stubs.jsonl", 320, prefix="q")
    worker = start_worker("g", concurrency=2, model=str(stub_model))
    worker.wait_ready()
    run_cli(["submit", str(tmp_path / "stubs.jsonl"), "--run", "stubs", "--model", str(stub_model), "--output",
             f"{s3_bucket}/stubs", "--batch-size", "8", "--max-tokens", "64",
             "--quality-thresholds", json.dumps({"gate_min_samples": 24, "gate_interval_s": 0})], env)

    paused = wait_for(lambda: (s := status_json(env, "stubs"))["status"] == "paused" and s, timeout_s=600,
                      what="the gate pausing the run", interval_s=1, on_timeout=lambda: worker.log()[-3000:])
    assert paused["samples"]["pending"] > 160, "paused early, with most of the run still to do"
    assert any(k in (paused["status_reason"] or "") for k in ("stub_answer", "empty_answer", "empty_reasoning"))

    # The workers stop generating it: in-flight batches finish, then nothing more is done.
    def quiet():
        s = status_json(env, "stubs")
        return s["batches"]["running"] == 0 and s
    first = wait_for(quiet, timeout_s=120, what="in-flight batches to finish", interval_s=1)
    import time

    time.sleep(8)
    later = status_json(env, "stubs")
    assert later["samples"]["done"] == first["samples"]["done"] and later["status"] == "paused"

    refused = run_cli(["resume", "--run", "stubs"], env, check=False)
    assert refused.returncode == 2 and "would be paused again" in refused.stderr
    forced = run_cli(["resume", "--run", "stubs", "--force"], env)
    assert "queued batches published again" in forced.stdout
    done = wait_for(lambda: (s := status_json(env, "stubs"))["samples"]["pending"] == 0 and s, timeout_s=600,
                    what="the forced run to finish", interval_s=2, on_timeout=lambda: worker.log()[-3000:])
    assert done["status"] == "finished"
