"""``regen export`` on a finished run built in a real ledger and moto S3, read back by the real consumers:
``datasets`` for the messages Parquet, speculators 0.9.0's prepare-data path and SpecForge 0.2.0's
pre-tokenized prompt loader for the tokens JSONL."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ledger.errors import ChecksumMismatch, ConfigError
from ledger.objects import ObjectStore
from ledger.shards import decode_shard, encode_shard, output_shard_url
from producer.results.export import export_run
from tests.support import finished_run as fr
from tests.support import helpers

CONVERSATIONS = [
    fr.ok("s01"), fr.ok("s02", "b.jsonl", 4), fr.ok("s03", words=40), fr.ok("s04"), fr.ok("s05", "b.jsonl", 9),
    fr.stub("s06"), fr.stub("s07", "b.jsonl", 2),
    fr.truncated("s08"),
    fr.tool("s09"), fr.tool("s10", "a.jsonl", 7),
    fr.failed("s11"),
    fr.aborted_last_turn("s12"),
]
DONE = [c for c in CONVERSATIONS if not c.failed]
# Generation events of the done samples, less the one aborted generation.
TOKEN_ROWS = sum(len(c.turns) for c in DONE) - 1


def require(module: str):
    """Import a consumer; skip when it is missing here, fail under CI (which must install it)."""
    return helpers.require(module, "see docs/quality.md for the test install (scripts/install.sh does it)")


@pytest.fixture
def tokenizer(tiny_model):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_model / "tokenizer.json"))


@pytest.fixture
def store(s3_env) -> ObjectStore:
    return ObjectStore(max_attempts=3)


@pytest.fixture
def run(sessions, store, s3_bucket, tokenizer, tiny_model):
    return fr.build_run(sessions, store, s3_bucket, tokenizer, CONVERSATIONS, name="exp", model=str(tiny_model),
                        pending=2)


def shard_rows(store: ObjectStore, run: dict) -> dict[str, dict]:
    rows = {}
    for seq in range(3):
        rows.update({r["sample_id"]: r for r in decode_shard(store.get(output_shard_url(run["output_url"], seq)))})
    return rows


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_messages_export_has_one_row_per_done_sample_and_loads_with_datasets(sessions, store, run, tmp_path):
    datasets = require("datasets")
    manifest = export_run(sessions, store, ["exp"], "messages", tmp_path / "out", include_all=True)

    loaded = datasets.load_dataset("parquet", data_files=[str(f) for f in manifest.files], split="train")
    assert loaded.num_rows == len(DONE) == manifest.data["counts"]["samples"]
    assert loaded["sample_id"] == sorted(c.sample_id for c in DONE)  # the pending samples' stray upload is ignored
    tool_row = loaded[loaded["sample_id"].index("s09")]
    assert [m["role"] for m in tool_row["messages"]] == ["user", "assistant", "tool", "assistant"]
    call = tool_row["messages"][1]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "C"}
    assert tool_row["messages"][3]["reasoning_content"] == "The tool says 21 degrees."
    assert json.loads(tool_row["tools"]) == fr.TOOLS
    assert (tool_row["quality"], tool_row["source_file"], tool_row["run"]) == ("ok", "b.jsonl", "exp")
    assert manifest.data["left_out"]["samples"]["failed"]["count"] == 1
    assert manifest.data["left_out"]["samples"]["not_committed"]["count"] == 2


def test_bad_classes_are_left_out_by_default_and_the_manifest_says_why(sessions, store, run, tmp_path):
    manifest = export_run(sessions, store, ["exp"], "messages", tmp_path / "default")
    import pyarrow.parquet as pq

    ids = [sid for f in manifest.files for sid in pq.read_table(f).column("sample_id").to_pylist()]
    assert ids == ["s01", "s02", "s03", "s04", "s05", "s09", "s10"]
    left = manifest.data["left_out"]["samples"]
    assert {k: v["count"] for k, v in left.items()} == {
        "failed": 1, "stub_answer": 2, "truncated_reasoning": 2, "not_committed": 2}
    assert "--include stub_answer" in left["stub_answer"]["why"]
    assert manifest.data["filters"]["excluded_classes"][:2] == ["failed", "empty_answer"]

    with_stubs = export_run(sessions, store, ["exp"], "messages", tmp_path / "stubs", include=["stub_answer"])
    assert with_stubs.data["counts"]["samples_by_class"] == {"stub_answer": 2, "ok": 7}
    assert "stub_answer" not in with_stubs.data["left_out"]["samples"]


def test_tokens_rows_are_boundary_rows_straight_from_the_engine_ids(sessions, store, run, tmp_path, tiny_model):
    manifest = export_run(sessions, store, ["exp"], "tokens", tmp_path / "tok", include_all=True)
    rows = [r for f in manifest.files for r in jsonl(f)]
    assert len(rows) == TOKEN_ROWS == manifest.data["counts"]["rows"]
    assert manifest.data["left_out"]["generations"]["failed_generation"]["count"] == 1
    assert [r["id"] for r in rows if r["primary_id"] in ("s09", "s12")] == ["s09_gen0", "s09_gen1", "s12_gen0"]

    source = shard_rows(store, run)
    for r in rows:
        event = source[r["primary_id"]]["events"][r["metadata"]["turn"]]
        prompt, completion = event["prompt_token_ids"], event["completion_token_ids"]
        assert r["input_ids"] == prompt + completion
        assert r["loss_mask"] == [0] * len(prompt) + [1] * len(completion)
        assert r["text"].startswith("<|im_start|>user\n") and "<think>" in r["text"]
        meta = r["metadata"]
        assert meta["finish_reason"] in ("stop", "length")
        assert meta["usage"]["completion_tokens"] == len(completion)
        assert meta["sampling_params"]["temperature"] == 0.6
        assert meta["provenance"]["run"] == "exp" and meta["provenance"]["source_file"] in ("a.jsonl", "b.jsonl")
    stub_row = next(r for r in rows if r["primary_id"] == "s06")
    assert stub_row["text"].endswith("<think>\n\n</think>\n\nOK.<|im_end|>")
    assert stub_row["metadata"]["quality"] == "stub_answer"
    assert next(r for r in rows if r["id"] == "s09_gen0")["metadata"]["is_tool_call"] is True
    seeds = {r["metadata"]["sampling_params"]["seed"] for r in rows if r["primary_id"] == "s09"}
    assert len(seeds) == 2  # each generation records its own seed


def test_speculators_prepare_data_and_specforge_accept_every_tokens_row(sessions, store, run, tmp_path,
                                                                        tiny_model):
    manifest = export_run(sessions, store, ["exp"], "tokens", tmp_path / "tok", include_all=True, shard_rows=4)
    assert len(manifest.files) > 1
    ours = Counter(tuple(r["input_ids"]) + tuple(r["loss_mask"]) for f in manifest.files for r in jsonl(f))

    prompt_builder = require("specforge.data.prompt_builder")
    accepted: Counter = Counter()
    for f in manifest.files:
        tasks = prompt_builder.prepare_prompt_tasks(
            f, None, chat_template=None, max_length=8192, is_preformatted=False, train_only_last_turn=False,
            cache_dir=None, cache_key=None, num_proc=None)
        assert len(tasks) == len(jsonl(f))
        accepted.update(tuple(t["payload"]["input_ids"]) + tuple(t["payload"]["loss_mask"]) for t in tasks)
    assert accepted == ours

    require("speculators")
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    # What `speculators prepare-data --model M --data OUT/data` runs (no render endpoint: pre-tokenized rows).
    dataset, _ = load_and_preprocess_dataset(str(tiny_model), [str(manifest.path.parent / "data")],
                                             seq_length=8192, build_dataset_num_proc=1,
                                             token_freq_path=tmp_path / "freq.pt")
    assert len(dataset) == sum(ours.values())
    prepared = Counter(tuple(r["input_ids"].tolist()) + tuple(r["loss_mask"].tolist()) for r in dataset)
    assert prepared == ours


def test_the_export_is_deterministic_sorted_and_sharded(sessions, store, run, tmp_path):
    first = export_run(sessions, store, ["exp"], "messages", tmp_path / "a", include_all=True, shard_rows=3)
    second = export_run(sessions, store, ["exp"], "messages", tmp_path / "b", include_all=True, shard_rows=3)
    names = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert [s["path"] for s in first.data["shards"]] == [f"data/train-0000{n}-of-00004.parquet" for n in range(4)]
    assert [s["rows"] for s in first.data["shards"]] == [3, 3, 3, 2]
    assert first.data == second.data

    tokens = export_run(sessions, store, ["exp"], "tokens", tmp_path / "t", include_all=True, shard_rows=3)
    ids = [(r["primary_id"], r["metadata"]["turn"]) for f in tokens.files for r in jsonl(f)]
    assert ids == sorted(ids)
    # A sample's generations never straddle two shards.
    per_shard = [{r["primary_id"] for r in jsonl(f)} for f in tokens.files]
    assert sum(len(s) for s in per_shard) == len(set().union(*per_shard))


def test_runs_are_exported_together_only_with_one_config_hash(sessions, store, s3_bucket, tokenizer, tiny_model,
                                                              run, tmp_path):
    fr.build_run(sessions, store, s3_bucket, tokenizer, [fr.ok("s01"), fr.ok("t01")], name="twin",
                 model=str(tiny_model))
    fr.build_run(sessions, store, s3_bucket, tokenizer, [fr.ok("u01")], name="other", model=str(tiny_model),
                 config_hash="d" * 64)
    with pytest.raises(ConfigError, match="different configurations"):
        export_run(sessions, store, ["exp", "other"], "messages", tmp_path / "x")

    both = export_run(sessions, store, ["exp", "twin"], "messages", tmp_path / "both")
    assert both.data["counts"]["samples"] == 8  # 7 ok from exp, t01 from twin; s01 only once
    assert both.data["left_out"]["samples"]["duplicate_sample_id"]["count"] == 1
    assert [r["exported_samples"] for r in both.data["runs"]] == [7, 1]


def test_a_shard_changed_after_its_commit_fails_the_export(sessions, store, run, tmp_path, tokenizer,
                                                           tiny_model):
    forged = [fr.output_row(tokenizer, fr.ok(c.sample_id), run="exp", model=str(tiny_model))
              for c in CONVERSATIONS[:4]]
    store.put(output_shard_url(run["output_url"], 0), encode_shard(forged))
    with pytest.raises(ChecksumMismatch, match="the ledger recorded"):
        export_run(sessions, store, ["exp"], "messages", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []  # nothing half-written is left to be mistaken for data


def test_rows_committed_before_classification_are_classified_while_exporting(sessions, store, s3_bucket,
                                                                              tokenizer, tiny_model, tmp_path):
    fr.build_run(sessions, store, s3_bucket, tokenizer, [fr.ok("a"), fr.stub("b"), fr.ok("c")], name="legacy",
                 model=str(tiny_model), classify=False)
    manifest = export_run(sessions, store, ["legacy"], "tokens", tmp_path / "out")
    assert [r["primary_id"] for f in manifest.files for r in jsonl(f)] == ["a", "c"]
    assert manifest.data["left_out"]["samples"]["stub_answer"]["count"] == 1


def test_bad_requests_are_refused_before_anything_is_written(sessions, store, run, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        export_run(sessions, store, ["exp"], "messages", tmp_path / "full")
    with pytest.raises(ConfigError, match="unknown class"):
        export_run(sessions, store, ["exp"], "messages", tmp_path / "a", include=["stubby"])
    with pytest.raises(ConfigError, match="format"):
        export_run(sessions, store, ["exp"], "sharegpt", tmp_path / "b")
    with pytest.raises(ConfigError, match="no run named"):
        export_run(sessions, store, ["nope"], "messages", tmp_path / "c")
    with pytest.raises(ConfigError, match="tokenizer"):
        export_run(sessions, store, ["exp"], "tokens", tmp_path / "d", tokenizer=str(tmp_path / "missing"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists()


@pytest.mark.engine
def test_rows_generated_by_the_engine_are_classified_and_exported_for_the_consumers(
        sessions, store, s3_bucket, engine_host, renderer, tmp_path):
    from ledger.quality import CLASSES, Thresholds, classify_sample
    from producer.dataset.normalize import normalize_row
    from worker.generation import generate_batch

    sample_dir = Path(__file__).resolve().parents[2] / "data" / "sample"
    samples = []
    for name in ("openai_chat.jsonl", "tools.jsonl"):
        for n, line in enumerate((sample_dir / name).read_text().splitlines()[:4]):
            sample = normalize_row(json.loads(line))
            sample["source"] = {"file": name, "row": n + 1}
            samples.append(sample)
    sampling = {**fr.SAMPLING, "max_tokens": 48}
    run = {"id": 1, "name": "real", "model": engine_host.model, "config_hash": "e" * 64, "sampling": sampling,
           "provenance": {"engine": engine_host.engine_version, "chat_template_sha256": renderer.template_hash}}
    rows = engine_host.submit(generate_batch(engine_host, renderer, samples, run)).result(timeout=900)
    for row in rows:  # what the worker does before it uploads the shard
        quality, details = classify_sample(row, Thresholds())
        assert quality in CLASSES and len(details) == len(row["events"])
        row["quality"] = quality
        for event, detail in zip(row["events"], details, strict=True):
            event["quality"] = detail
    fr.build_run_from_rows(sessions, store, s3_bucket, rows, name="real", model=engine_host.model,
                           config_hash="e" * 64, sampling=sampling)

    manifest = export_run(sessions, store, ["real"], "tokens", tmp_path / "tok", include_all=True, shard_rows=5)
    exported = [r for f in manifest.files for r in jsonl(f)]
    events = {(r["sample_id"], e["turn"]): e for r in rows if r["status"] == "done" for e in r["events"]
              if e["finish_reason"] in ("stop", "length") and e["completion_token_ids"]}
    assert sorted((r["primary_id"], r["metadata"]["turn"]) for r in exported) == sorted(events)
    for r in exported:
        event = events[(r["primary_id"], r["metadata"]["turn"])]
        assert r["input_ids"] == event["prompt_token_ids"] + event["completion_token_ids"]
        assert r["text"] == engine_host.tokenizer.decode(r["input_ids"], skip_special_tokens=False)
        if r["metadata"]["turn"] == 0:  # the seed the worker recorded for the first generation
            source = next(row for row in rows if row["sample_id"] == r["primary_id"])
            assert r["metadata"]["sampling_params"]["seed"] == source["sampling"]["seed"]
    prompt_builder = require("specforge.data.prompt_builder")
    accepted = sum(len(prompt_builder.prepare_prompt_tasks(
        f, None, chat_template=None, max_length=8192, is_preformatted=False, train_only_last_turn=False,
        cache_dir=None, cache_key=None, num_proc=None)) for f in manifest.files)
    assert accepted == len(exported) == manifest.data["counts"]["rows"]
