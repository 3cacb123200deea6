"""``regen export`` on a finished run built in a real ledger and moto S3, read back by the real consumers:
``datasets`` for the messages Parquet, speculators 0.9.0's prepare-data path and SpecForge 0.2.0's
pre-tokenized prompt loader for the tokens JSONL."""

from __future__ import annotations

import hashlib
import json
import shutil
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


def test_bad_classes_are_left_out_by_default_and_the_manifest_says_why(sessions, store, run, tmp_path, settings,
                                                                      s3_env, monkeypatch):
    from producer.results import export

    monkeypatch.setattr(export, "PROGRESS_EVERY_S", 0.0)  # a progress line per output shard
    lines: list[str] = []
    manifest = export_run(sessions, store, ["exp"], "messages", tmp_path / "default", progress=lines.append)
    assert [line.split(", ")[0] for line in lines] == [f"{n}/3 output shards read" for n in (1, 2, 3)]
    assert lines[-1].split(", ")[1:3] == ["7 samples kept", "7 left out"]
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

    # regen export says the same: its progress on stderr, then what it wrote and left out, by reason.
    out = helpers.run_cli(["export", "--run", "exp", "--format", "messages", "--out", str(tmp_path / "cli")],
                          helpers.cli_env(settings, s3_env))
    assert "export: 3/3 output shards read, 7 samples kept, 7 left out" in out.stderr
    said = out.stdout.splitlines()
    assert said[0] == "exported 7 samples as 7 rows in 1 files"
    assert said[-1] == f"export: {tmp_path / 'cli' / 'manifest.json'}"
    assert sorted(said[1].split(" (")[0].removeprefix("left out: ").split(", ")) == [
        "failed 1", "not_committed 2", "stub_answer 2", "truncated_reasoning 2"]


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


def test_a_plan_spread_over_buckets_exports_the_same_bytes_in_code_point_order(sessions, store, s3_bucket, tokenizer,
                                                                              tiny_model, tmp_path, monkeypatch):
    from producer.results import export_plan

    # Ids whose order differs between collations (case, accents, punctuation): the export's order is
    # Python's (code points), whatever the ledger's collation.
    ids = ["b-2", "B-1", "a-9", "Z-3", "\u00e9-4", "e-5", "_-6", "0-7", "~-8", "A-10", "\u00c9-11", "z-12"]
    fr.build_run(sessions, store, s3_bucket, tokenizer, [fr.ok(i) for i in ids], name="mixed", model=str(tiny_model),
                 batch_size=3)
    one = export_run(sessions, store, ["mixed"], "messages", tmp_path / "one", shard_rows=4)

    bucket_sizes: list[int] = []
    output_shards = export_plan.ExportPlan.output_shards

    def counted(plan):
        for bucket in output_shards(plan):
            bucket_sizes.append(sum(len(shard.wanted) for shard in bucket))
            yield bucket

    monkeypatch.setattr(export_plan.ExportPlan, "output_shards", counted)
    monkeypatch.setattr(export_plan, "BUCKET_SAMPLES", 2)
    monkeypatch.setattr(export_plan, "FLUSH_LINES", 5)
    many = export_run(sessions, store, ["mixed"], "messages", tmp_path / "many", shard_rows=4)

    # The plan was held a part at a time, never whole ...
    assert len(bucket_sizes) > 1 and max(bucket_sizes) < len(ids) == sum(bucket_sizes)
    # ... and the export is the one a single part makes, byte for byte.
    assert many.data == one.data
    for shard in one.data["shards"]:
        assert (tmp_path / "many" / shard["path"]).read_bytes() == (tmp_path / "one" / shard["path"]).read_bytes()
    import pyarrow.parquet as pq

    exported = [sid for f in many.files for sid in pq.read_table(f).column("sample_id").to_pylist()]
    assert exported == sorted(ids)
    assert [s["rows"] for s in many.data["shards"]] == [4, 4, 4]


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


def expected_side(sample_id: str, seed: int, share: float) -> str:
    """The split rule of docs/quality.md, written out again: sha256 of "split<US>seed<US>id", 8 bytes."""
    digest = hashlib.sha256("\x1f".join(["split", str(seed), sample_id]).encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2**64 < share else "train"


def recount(files: list[Path]) -> Counter:
    """Token ids under the loss mask, recounted from exported tokens rows."""
    counts: Counter = Counter()
    for f in files:
        for r in jsonl(f):
            counts.update(t for t, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m == 1)
    return counts


def parquet_counts(path: Path) -> Counter:
    import pyarrow.parquet as pq

    table = pq.read_table(path).to_pydict()
    assert table["token_id"] == sorted(table["token_id"])
    return Counter(dict(zip(table["token_id"], table["count"], strict=True)))


@pytest.fixture
def qwen_sized_tokenizer(tiny_model, tmp_path) -> Path:
    """The tiny tokenizer beside a config.json whose embedding has Qwen3's 151,936 rows (> 32,000)."""
    folder = tmp_path / "target"
    folder.mkdir()
    shutil.copy(tiny_model / "tokenizer.json", folder / "tokenizer.json")
    (folder / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 151_936}, "vocab_size": 1}))
    return folder


def test_eval_split_is_fixed_by_sample_id_and_the_draft_vocab_loads_in_both_peers(
        sessions, store, run, tmp_path, qwen_sized_tokenizer):
    done = [c.sample_id for c in DONE]
    # A seed whose 5% holds out an ok sample and a stub (left out by default): --include then changes
    # what is exported on both sides, and the split must not move.
    seed = next(s for s in range(10_000) if {"s01", "s06"} <= {i for i in done if expected_side(i, s, 0.05) == "eval"}
                or {"s02", "s07"} <= {i for i in done if expected_side(i, s, 0.05) == "eval"})
    options = {"eval_share": 0.05, "split_seed": seed, "draft_vocab": 32_000, "tokenizer": str(qwen_sized_tokenizer),
               "shard_rows": 4}
    first = export_run(sessions, store, ["exp"], "tokens", tmp_path / "a", **options)
    again = export_run(sessions, store, ["exp"], "tokens", tmp_path / "b", **options)
    stubs = export_run(sessions, store, ["exp"], "tokens", tmp_path / "c", include=["stub_answer"], **options)

    def ids(manifest, side):
        return [r["primary_id"] for f in manifest.files_of(side) for r in jsonl(f)]

    train, held = set(ids(first, "train")), set(ids(first, "eval"))
    assert held and not train & held  # every generation of a conversation on one side
    assert {i: expected_side(i, seed, 0.05) for i in train | held} == {
        **{i: "train" for i in train}, **{i: "eval" for i in held}}
    assert (ids(again, "train"), ids(again, "eval")) == (ids(first, "train"), ids(first, "eval"))
    assert set(ids(stubs, "eval")) - held and set(ids(stubs, "eval")) & (train | held) == held
    assert set(ids(stubs, "train")) & (train | held) == train
    split = first.data["split"]
    assert (split["seed"], split["eval_share"], "sha256" in split["rule"]) == (seed, 0.05, True)
    assert (split["train"]["samples"], split["eval"]["samples"]) == (len(train), len(held))
    assert split["train"]["rows"] + split["eval"]["rows"] == len(ids(first, "train")) + len(ids(first, "eval"))
    assert all(f.parent.name == "eval" for f in first.files_of("eval")) and not (tmp_path / "a" / "data").exists()
    for name in ("manifest.json", "stats/token_counts.parquet", "vocab/d2t-32000.npy", "vocab/vocab_mapping-32000.pt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name

    # The counts: the training side's rows recounted, per file and in total; eval rows never count.
    counted = recount(first.files_of("train"))
    assert parquet_counts(tmp_path / "a" / "stats" / "token_counts.parquet") == counted
    for shard in first.data["shards"]:
        if shard["split"] == "train":
            per_file = parquet_counts(tmp_path / "a" / shard["token_counts"]["path"])
            assert per_file == recount([tmp_path / "a" / shard["path"]])
            assert shard["token_counts"]["tokens"] == per_file.total()
        else:
            assert "token_counts" not in shard
    assert first.data["token_stats"]["total"]["tokens"] == counted.total()

    # The mapping files, loaded by the peers' own code (specforge 0.2.0, speculators 0.9.0).
    require("torch")
    import numpy as np
    import torch
    from transformers import LlamaConfig

    sf_draft = require("specforge.modeling.draft.llama3_eagle")
    from specforge.core.compact_teacher import validate_vocab_mapping_consistency
    from specforge.data.preprocessing import process_token_dict_to_mappings

    require("speculators")
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.train.cli import _load_mappings
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    layer = LlamaConfig(vocab_size=151_936, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                        num_key_value_heads=2, num_hidden_layers=1, max_position_embeddings=64)
    layer.draft_vocab_size = 32_000
    specforge_model = sf_draft.LlamaForCausalLMEagle3(layer)
    specforge_model.load_vocab_mapping(str(tmp_path / "a" / "vocab" / "vocab_mapping-32000.pt"))
    validate_vocab_mapping_consistency(specforge_model.t2d, specforge_model.d2t)
    d2t, t2d, size = _load_mappings(tmp_path / "a" / "vocab" / "d2t-32000.npy",
                                    tmp_path / "a" / "vocab" / "t2d-32000.npy", 32_000)
    speculators_model = Eagle3DraftModel(Eagle3SpeculatorConfig(transformer_layer_config=layer, draft_vocab_size=size))
    speculators_model.load_vocab_mappings(t2d, d2t)
    assert (d2t.dtype, t2d.dtype, tuple(t2d.shape)) == (torch.int64, torch.bool, (151_936,))
    their_d2t, their_t2d = build_vocab_mappings_from_distribution(dict(counted), 32_000, 151_936)
    assert torch.equal(speculators_model.d2t, their_d2t) and torch.equal(speculators_model.t2d, their_t2d)
    assert torch.equal(specforge_model.d2t, their_d2t) and torch.equal(specforge_model.t2d, their_t2d)
    assert set(np.flatnonzero(t2d.numpy())) >= set(counted)  # every trained token is drafted
    assert first.data["draft_vocab"]["filled_with_unseen"] == 32_000 - len(counted)

    # A draft vocabulary smaller than the tokens seen: the most counted, ties by the lower id, as speculators
    # (and SpecForge, which breaks ties by the order it met the ids: here ascending). SpecForge's builder
    # is O(V x N), too slow for N = 32,000 in a test.
    small = export_run(sessions, store, ["exp"], "tokens", tmp_path / "small", **{**options, "draft_vocab": 20})
    their_d2t, their_t2d = build_vocab_mappings_from_distribution(dict(counted), 20, 151_936)
    assert np.array_equal(np.load(tmp_path / "small" / "vocab" / "d2t-20.npy"), their_d2t.numpy())
    assert np.array_equal(np.load(tmp_path / "small" / "vocab" / "t2d-20.npy"), their_t2d.numpy())
    sf_d2t, sf_t2d = process_token_dict_to_mappings(Counter(dict(sorted(counted.items()))), 20, 151_936)
    mapping = torch.load(tmp_path / "small" / "vocab" / "vocab_mapping-20.pt")
    assert torch.equal(mapping["d2t"], sf_d2t) and torch.equal(mapping["t2d"], sf_t2d)
    assert 0 < small.data["draft_vocab"]["coverage"] < 1


def test_a_messages_export_splits_by_the_run_seed_and_counts_the_same_tokens(sessions, store, run, tmp_path):
    import pyarrow.parquet as pq

    tokens = export_run(sessions, store, ["exp"], "tokens", tmp_path / "t", include_all=True, eval_share=0.5)
    messages = export_run(sessions, store, ["exp"], "messages", tmp_path / "m", include_all=True, eval_share=0.5)
    assert messages.data["split"]["seed"] == fr.SAMPLING["seed"] and messages.data["split"]["seed_from"] == "run sampling"
    held = {sid for f in messages.files_of("eval") for sid in pq.read_table(f).column("sample_id").to_pylist()}
    assert held == {c.sample_id for c in DONE if expected_side(c.sample_id, fr.SAMPLING["seed"], 0.5) == "eval"}
    assert held == {r["primary_id"] for f in tokens.files_of("eval") for r in jsonl(f)}
    # A messages export counts the engine's completion ids of the same generations a tokens export writes.
    assert parquet_counts(tmp_path / "m" / "stats" / "token_counts.parquet") == recount(tokens.files_of("train"))


def test_bad_split_and_draft_vocab_requests_are_refused_before_anything_is_written(sessions, store, run, tmp_path,
                                                                                   qwen_sized_tokenizer, tiny_model):
    with pytest.raises(ConfigError, match="--eval-share"):
        export_run(sessions, store, ["exp"], "messages", tmp_path / "a", eval_share=1.0)
    with pytest.raises(ConfigError, match="fewer than the target's 151936"):
        export_run(sessions, store, ["exp"], "messages", tmp_path / "b", draft_vocab=151_936,
                   tokenizer=str(qwen_sized_tokenizer))
    (qwen_sized_tokenizer / "config.json").unlink()
    with pytest.raises(ConfigError, match="config.json"):
        export_run(sessions, store, ["exp"], "tokens", tmp_path / "c", draft_vocab=100,
                   tokenizer=str(qwen_sized_tokenizer))
    assert not any((tmp_path / name).exists() for name in "abc")


@pytest.mark.engine
def test_rows_generated_by_the_engine_are_classified_and_exported_for_the_consumers(
        sessions, store, s3_bucket, engine_host, renderer, tmp_path):
    from ledger.quality import CLASSES, Thresholds, classify_sample
    from producer.dataset.normalize import normalize_row
    from worker.conversation.generation import generate_batch

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

