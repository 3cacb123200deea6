"""The whole path with every part real: submit → Redis → two vLLM workers → S3 → Postgres ledger."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis as redis_lib
from sqlalchemy import text

from ledger.objects import ObjectStore
from tests.support.helpers import ROOT, cli_env, input_rows, output_rows, run_cli, status_json, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SAMPLE = ROOT / "data" / "sample"


def test_sample_dataset_is_regenerated_end_to_end_by_two_workers(settings, s3_env, s3_bucket, sessions,
                                                                  start_worker, tiny_model):
    env = cli_env(settings, s3_env)
    output = f"{s3_bucket}/regen/e2e"
    submit_args = ["submit", str(SAMPLE), "--run", "e2e", "--model", str(tiny_model), "--output", output,
                   "--batch-size", "16", "--max-tokens", "48", "--seed", "7", "--json",
                   # Random weights never finish a thought: every sample is truncated, which the quality
                   # gate would (rightly) pause. This test is about the plumbing, so the gate stays out.
                   "--quality-thresholds", '{"gate_overridden": true}']
    # Both workers up first, so each takes a share of the batches.
    workers = [start_worker("a", compiled=True), start_worker("b", compiled=True)]  # as users run them
    for w in workers:
        w.wait_ready()
    first = run_cli(submit_args, env)
    report = json.loads(first.stdout)
    # data/sample: 291 good rows of which one repeats an id, 8 malformed rows of 8 kinds.
    assert report["created"] and report["samples_new"] == 290
    assert report["rejected"] == 8 and report["duplicates"] == 1

    def all_done():
        s = status_json(env, "e2e")
        return s if s["samples"]["pending"] == 0 and s["batches"]["running"] == 0 else None

    final = wait_for(all_done, timeout_s=600, what="every sample regenerated", interval_s=2,
                     on_timeout=lambda: "\n".join(w.log()[-3000:] for w in workers))
    assert final["status"] == "finished"
    assert final["samples"]["done"] == report["samples_new"]
    assert final["samples"]["failed"] == 0
    assert final["samples"]["rejected"] == report["rejected"]
    assert final["batches"]["done"] == report["batches_new"]

    store = ObjectStore()
    inputs = {r["sample_id"]: r for r in input_rows(store, output)}
    outputs = output_rows(store, output)
    ids = [r["sample_id"] for r in outputs]
    # Each output row belongs to its input, once.
    assert len(ids) == len(set(ids)) == len(inputs)
    for row in outputs:
        assert row["input_messages"] == inputs[row["sample_id"]]["messages"]
        assert row["status"] == "done"
        assert row["events"], row["sample_id"]
        assert row["messages"][-1]["role"] in ("assistant", "tool", "user")
        for event in row["events"]:
            assert len(event["loss_mask"]) == len(event["prompt_token_ids"]) + len(event["completion_token_ids"])
            assert sum(event["loss_mask"]) == len(event["completion_token_ids"]) > 0
        assert row["model"] == str(tiny_model)

    with sessions() as s:
        done = s.execute(text("SELECT count(*) FROM samples WHERE status = 'done'")).scalar()
        tokens = s.execute(text("SELECT sum(completion_tokens) FROM samples")).scalar()
        by_worker = dict(s.execute(text("SELECT worker, count(*) FROM batches GROUP BY worker")).all())
        reasons = dict(s.execute(text("SELECT reason, count(*) FROM rejected_rows GROUP BY reason")).all())
        provenance = s.execute(text("SELECT provenance FROM runs WHERE name = 'e2e'")).scalar()
    # The acceptance query: the ledger's done count equals the distinct ids in the shards.
    assert done == len(set(ids))
    assert tokens == sum(r["usage"]["completion_tokens"] for r in outputs)
    assert len(by_worker) == 2, f"both workers should have generated batches: {by_worker}"
    assert reasons.get("duplicate_id", 0) == report["duplicates"]
    assert sum(reasons.values()) == report["rejected"] + report["duplicates"]
    # The run records what its engine was built with: regen's settings for the platform (the CPU
    # build's: no chunked prefill) and what vLLM sized from them, and both workers logged the same.
    settings_record = provenance["engine_settings"]
    assert settings_record["args"]["enable_chunked_prefill"] is False, settings_record
    assert settings_record["kv_cache_tokens"] > 0 and settings_record["max_num_seqs"] > 0, settings_record
    for w in workers:
        assert "settings chosen: engine args " in w.log() and "enable_chunked_prefill=False" in w.log()

    # A repeated submit changes nothing: no new sample, batch or message.
    queue_len = redis_lib.Redis.from_url(settings.redis_url).llen("regen")
    again = json.loads(run_cli(submit_args, env).stdout)
    assert again["created"] is False
    assert again["samples_new"] == 0 and again["batches_new"] == 0 and again["batches_republished"] == 0
    assert again["samples_known"] == report["samples_new"]
    assert redis_lib.Redis.from_url(settings.redis_url).llen("regen") == queue_len == 0
    after = status_json(env, "e2e", via_cli=True)  # the command itself, once
    assert after["samples"] == final["samples"]
    assert Counter(r["sample_id"] for r in output_rows(store, output)) == Counter(ids)
    # A clean shutdown reads as one: SIGTERM, exit 0, and no ERROR line in the worker's log
    # (vLLM's output task used to be destroyed pending: "ERROR ... Task was destroyed").
    for worker in workers:
        assert worker.stop() == 0, worker.log()[-3000:]
        errors = [line for line in worker.log().splitlines() if "ERROR" in line or "Task was destroyed" in line]
        assert not errors, "\n".join(errors[:10])
