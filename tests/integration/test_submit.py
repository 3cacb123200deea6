"""``regen submit`` against the real ledger, broker and object store (no engine needed)."""

from __future__ import annotations

import json

import redis as redis_lib
from sqlalchemy import text

from ledger.shards import decode_shard
from tests.support.helpers import cli_env, input_rows, run_cli


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _user(i):
    return {"id": f"u{i}", "messages": [{"role": "user", "content": f"hello {i}"}]}


def test_every_bad_row_is_recorded_with_file_line_and_reason_and_the_rest_goes_on(settings, s3_env, s3_bucket,
                                                                                   sessions, tmp_path, model_folder):
    data = _write(tmp_path / "mixed.jsonl", [
        _user(1), "{not json", {"messages": [{"role": "wizard", "content": "x"}]}, _user(2),
        {"messages": [{"role": "assistant", "content": "no question"}]}, {"messages": "nope"}, _user(1)])
    out = run_cli(["submit", str(data), "--run", "mixed", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/mixed",
                   "--json"], cli_env(settings, s3_env))
    report = json.loads(out.stdout)
    assert (report["samples_new"], report["rejected"], report["duplicates"]) == (2, 4, 1)
    with sessions() as s:
        rows = s.execute(text("SELECT source_row, reason FROM rejected_rows ORDER BY source_row")).all()
    assert [(r.source_row, r.reason) for r in rows] == [
        (2, "malformed_json"), (3, "unknown_role"), (5, "no_user_turn"), (6, "wrong_type"), (7, "duplicate_id")]


def test_a_different_config_under_an_existing_run_name_is_refused(settings, s3_env, s3_bucket, tmp_path,
                                                                  model_folder):
    env = cli_env(settings, s3_env)
    data = _write(tmp_path / "a.jsonl", [_user(i) for i in range(3)])
    base = ["submit", str(data), "--run", "r", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/r"]
    run_cli(base + ["--temperature", "0.7"], env)
    refused = run_cli(base + ["--temperature", "0.9"], env, check=False)
    assert refused.returncode == 2
    assert "temperature 0.7 != 0.9" in refused.stderr and "new run name" in refused.stderr
    other_model = run_cli(["submit", str(data), "--run", "r", "--model", str(model_folder("other")), "--output", f"{s3_bucket}/r",
                           "--temperature", "0.7"], env, check=False)
    assert other_model.returncode == 2 and "model" in other_model.stderr


def test_a_submit_that_could_not_publish_is_finished_by_running_it_again(settings, s3_env, s3_bucket, sessions,
                                                                        tmp_path, model_folder):
    env = cli_env(settings, s3_env)
    data = _write(tmp_path / "a.jsonl", [_user(i) for i in range(10)])
    args = ["submit", str(data), "--run", "r", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/r", "--batch-size", "4",
            "--json"]
    # The broker is down: the submit stops before registering anything.
    broken = run_cli(args, {**env, "REDIS_URL": "redis://127.0.0.1:1/0"}, check=False)
    assert broken.returncode != 0
    with sessions() as s:
        assert s.execute(text("SELECT count(*) FROM batches")).scalar() == 0
    # A window of one message: the rest stays planned, and the next submit publishes it.
    first = json.loads(run_cli(args, {**env, "REGEN_QUEUE_WINDOW": "1"}).stdout)
    assert (first["batches_new"], first["batches_published"], first["batches_planned"]) == (3, 1, 2)
    with sessions() as s:
        assert dict(s.execute(text("SELECT status, count(*) FROM batches GROUP BY status")).all()) == {
            "queued": 1, "planned": 2}
    again = json.loads(run_cli(args, env).stdout)
    assert again["batches_republished"] == 2 and again["samples_new"] == 0 and again["samples_known"] == 10
    assert redis_lib.Redis.from_url(settings.redis_url).llen("regen") == 3
    with sessions() as s:
        assert dict(s.execute(text("SELECT status, count(*) FROM batches GROUP BY status")).all()) == {"queued": 3}


def test_new_rows_appended_to_a_dataset_become_new_batches_on_resubmit(settings, s3_env, s3_bucket, sessions,
                                                                      tmp_path, model_folder):
    env = cli_env(settings, s3_env)
    data = tmp_path / "grow.jsonl"
    args = ["submit", str(data), "--run", "g", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/g", "--batch-size", "4",
            "--json"]
    _write(data, [_user(i) for i in range(6)])
    first = json.loads(run_cli(args, env).stdout)
    _write(data, [_user(i) for i in range(9)])
    second = json.loads(run_cli(args, env).stdout)
    assert (first["samples_new"], first["batches_new"]) == (6, 2)
    assert (second["samples_new"], second["batches_new"], second["samples_known"]) == (3, 1, 6)
    with sessions() as s:
        seqs = [r[0] for r in s.execute(text("SELECT seq FROM batches ORDER BY seq"))]
    assert seqs == [1, 2, 3]
    assert redis_lib.Redis.from_url(settings.redis_url).llen("regen") == 3


def test_a_message_carries_only_ids_and_the_shard_key(settings, s3_env, s3_bucket, model_folder, tmp_path):
    env = cli_env(settings, s3_env)
    data = _write(tmp_path / "a.jsonl", [{"id": "secret-prompt", "messages": [
        {"role": "user", "content": "THE PROMPT TEXT MUST NOT BE IN REDIS"}]}])
    run_cli(["submit", str(data), "--run", "ids", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/ids"], env)
    [raw] = redis_lib.Redis.from_url(settings.redis_url).lrange("regen", 0, -1)
    message = json.loads(raw)
    assert message["content-type"] == "application/json"
    assert b"THE PROMPT TEXT" not in raw
    body = json.loads(__import__("base64").b64decode(message["body"]))
    assert set(body[1]) == {"run", "run_id", "batch_id", "seq", "input_key"}


def test_a_groups_batches_share_one_object_and_each_reads_and_verifies_alone(settings, s3_env, s3_bucket, sessions,
                                                                            tmp_path, monkeypatch, model_folder):
    from ledger.objects import ObjectStore
    from ledger.shards import InputSlice, read_input_shard

    env = cli_env(settings, s3_env)
    data = tmp_path / "grow.jsonl"
    args = ["submit", str(data), "--run", "p", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/p", "--batch-size", "4"]
    _write(data, [_user(i) for i in range(10)])
    run_cli(args, env)
    _write(data, [_user(i) for i in range(13)])
    run_cli(args, env)  # the resumed submit appends a batch, in an object of its own
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    store = ObjectStore()
    with sessions() as s:
        batches = s.execute(text("SELECT seq, input_key, input_offset, input_length, input_sha256, n_samples "
                                 "FROM batches ORDER BY seq")).all()
        ids = {r.sample_id: r.batch_id for r in s.execute(text("SELECT sample_id, b.seq AS batch_id FROM samples "
                                                              "JOIN batches b ON b.id = samples.batch_id"))}
    assert [(b.seq, b.input_key.rsplit("/", 1)[1], b.n_samples) for b in batches] == [
        (1, "group-000001.jsonl.zst", 4), (2, "group-000001.jsonl.zst", 4), (3, "group-000001.jsonl.zst", 2),
        (4, "group-000004.jsonl.zst", 3)]
    # The ranges tile the object, and each batch's rows are exactly its samples in the ledger.
    group = store.get(batches[0].input_key)
    assert [b.input_offset for b in batches[:3]] == [0, batches[0].input_length,
                                                     batches[0].input_length + batches[1].input_length]
    assert sum(b.input_length for b in batches[:3]) == len(group)
    for b in batches:
        rows = list(decode_shard(read_input_shard(store, InputSlice(b.input_key, b.input_offset, b.input_length,
                                                                     b.input_sha256))))
        assert [r["sample_id"] for r in rows] and all(ids[r["sample_id"]] == b.seq for r in rows)
    assert sorted(r["sample_id"] for r in input_rows(store, f"{s3_bucket}/p")) == sorted(ids)


def test_a_worker_claim_carries_where_its_batch_input_is(settings, s3_env, s3_bucket, sessions, tmp_path,
                                                         monkeypatch, model_folder):
    from ledger.objects import ObjectStore
    from ledger.shards import read_input_shard
    from worker.batches.ledger_calls import ClaimOutcome, claim_batch

    data = _write(tmp_path / "a.jsonl", [_user(i) for i in range(6)])
    run_cli(["submit", str(data), "--run", "w", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/w", "--batch-size", "4"],
            cli_env(settings, s3_env))
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    with sessions() as s:
        second = s.execute(text("SELECT id FROM batches WHERE seq = 2")).scalar_one()
    claim = claim_batch(sessions, second, worker="w1", lease_s=30)
    assert claim.outcome is ClaimOutcome.CLAIMED and claim.input is not None and claim.input.offset > 0
    rows = list(decode_shard(read_input_shard(ObjectStore(), claim.input)))
    assert [r["sample_id"] for r in rows] == ["u4", "u5"]
