"""``regen report`` on a run of mostly stubs, built in a real ledger and moto S3."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from ledger.objects import ObjectStore
from ledger.shards import decode_shard, output_shard_url
from producer.results.report import write_report
from tests.support import finished_run as fr

CONVERSATIONS = [
    fr.stub("s01"), fr.stub("s02"), fr.stub("s03", "b.jsonl", 1), fr.stub("s04"), fr.stub("s05"), fr.stub("s06"),
    fr.ok("s07"), fr.ok("s08", "b.jsonl", 2), fr.ok("s09", words=60),
    fr.tool("s10"), fr.failed("s11"), fr.truncated("s12"),
]
PLOTS = ("loss_mask_tokens.png", "lengths.png", "quality.png", "finish_reasons.png", "tool_calls.png", "sources.png")


@pytest.fixture
def store(s3_env) -> ObjectStore:
    return ObjectStore(max_attempts=3)


@pytest.fixture
def run(sessions, store, s3_bucket, tiny_model):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    return fr.build_run(sessions, store, s3_bucket, tokenizer, CONVERSATIONS, name="stubby", model=str(tiny_model),
                        pending=2)


def done_rows(store, run) -> list[dict]:
    rows = []
    for seq in range(3):
        rows += [r for r in decode_shard(store.get(output_shard_url(run["output_url"], seq))) if r["status"] == "done"]
    return rows


def test_the_report_of_a_stub_run_shows_the_stubs_everywhere(sessions, store, run, tmp_path):
    with sessions.begin() as s:  # judge this small run as the gate would judge a large one
        s.execute(text("UPDATE runs SET quality_thresholds = '{\"gate_min_samples\": 10}' WHERE id = :r"),
                  {"r": run["id"]})
    index = write_report(sessions, store, "stubby", tmp_path / "report")
    out = index.parent
    numbers = json.loads((out / "report.json").read_text())

    assert numbers["samples"] == {"done": 11, "failed": 1, "pending": 2, "committed": 12}
    assert numbers["quality"]["counts"] == {"failed": 1, "stub_answer": 6, "truncated_reasoning": 1, "ok": 4}
    assert numbers["quality"]["shares"]["stub_answer"] == 0.5
    gate = numbers["quality"]["gate"]
    assert gate["would_pause"] and gate["exceeded"] == ["stub_answer+empty_answer"]

    rows = done_rows(store, run)  # the pending batch's stray upload is not among them
    loss = sorted(sum(sum(e["loss_mask"]) for e in r["events"]) for r in rows)
    assert numbers["loss_mask_tokens"]["samples"] == len(rows) == 11
    assert numbers["loss_mask_tokens"]["p0"] == loss[0] and numbers["loss_mask_tokens"]["p100"] == loss[-1]
    assert numbers["loss_mask_tokens"]["under_16"] == sum(v < 16 for v in loss) >= 6
    assert numbers["generations"]["count"] == sum(len(r["events"]) for r in rows) == 12
    assert numbers["generations"]["finish_reasons"] == {"stop": 11, "length": 1}
    assert numbers["tool_calls"]["samples_with_calls"] == 1
    assert numbers["per_source"]["a.jsonl"]["classes"] == {"failed": 1, "ok": 2, "stub_answer": 5}
    assert numbers["per_source"]["b.jsonl"]["worst_bad_class"] in ("stub_answer", "truncated_reasoning")

    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, name
    page = index.read_text()
    assert all(f'src="{name}"' in page for name in PLOTS)
    assert "The quality gate would pause this run" in page
    assert page.count("<b>stub_answer</b>") == 3  # examples, at most three per class
    summary = (out / "summary.txt").read_text()
    assert "stub_answer 6 (50.0%)" in summary and "WOULD PAUSE" in summary


def test_a_large_run_is_sampled_evenly_for_per_generation_figures(sessions, store, run, tmp_path):
    index = write_report(sessions, store, "stubby", tmp_path / "r", max_shards=1)
    numbers = json.loads((index.parent / "report.json").read_text())
    assert numbers["generations"]["read_from_shards"] == "1 of 3"
    assert numbers["generations"]["count"] == 4  # the first batch: four stubs, one generation each
    # Per-sample figures still cover every committed sample (they come from the ledger).
    assert numbers["loss_mask_tokens"]["samples"] == 11
    assert not numbers["quality"]["gate"]["would_pause"]  # 12 classified < the default minimum of 200
