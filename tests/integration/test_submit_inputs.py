"""A user's own data through ``regen submit`` (issue 59): a ShareGPT JSON array, bad rows shown where the
user looks, a resubmit from another folder, a file that yields nothing, and the write check's probe.

Real CLI, real Postgres, Redis and moto S3; no engine.
"""

from __future__ import annotations

import json
import subprocess
import sys

from sqlalchemy import text

from ledger.objects import ObjectStore
from producer.submit_checks import check_output_writable
from tests.support.helpers import ROOT, cli_env


def _regen(args, env, cwd, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "producer.cli", *args], env={**env, "PYTHONPATH": str(ROOT)},
                          cwd=cwd, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"regen {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _conv(i):
    return {"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i} — ünïcode"},
                                             {"from": "gpt", "value": "answer"}]}


def _runs(sessions):
    with sessions() as s:
        return [r[0] for r in s.execute(text("SELECT name FROM runs ORDER BY id"))]


def test_a_sharegpt_array_submits_shows_its_bad_rows_and_resubmits_from_another_folder_idempotently(
        settings, s3_env, s3_bucket, sessions, tmp_path, model_folder):
    env = cli_env(settings, s3_env)
    data = tmp_path / "data"
    data.mkdir()
    bad = [{"conversations": [{"from": "wizard", "value": "x"}]} for _ in range(12)]
    (data / "chats.json").write_text(json.dumps([_conv(0), 7, *bad, _conv(1)], indent=1, ensure_ascii=False))
    args = ["--run", "mine", "--model", str(model_folder("m")), "--output", f"{s3_bucket}/mine"]

    first = _regen(["submit", "data/chats.json", *args], env, cwd=tmp_path)
    assert "2 new samples" in first.stdout and "13 rejected" in first.stdout
    shown = [line.strip() for line in first.stdout.splitlines() if line.startswith("  data/chats.json:")]
    assert shown[0] == "data/chats.json:1 not_an_object element holds an integer, expected an object"
    assert shown[1].startswith("data/chats.json:2 unknown_role ") and len(shown) == 10
    assert "  ... and 3 more" in first.stdout and "regen status --run mine --rejected" in first.stdout

    # From another folder, by another path: the same file, so the same rows, nothing new, no duplicates.
    again = json.loads(_regen(["submit", "chats.json", *args, "--json"], env, cwd=data).stdout)
    assert (again["samples_new"], again["samples_known"], again["duplicates"]) == (0, 2, 0)

    listed = _regen(["status", "--run", "mine", "--rejected", "--reason", "not_an_object"], env, cwd=tmp_path)
    assert listed.stdout.strip() == "data/chats.json:1 not_an_object element holds an integer, expected an object"
    every = _regen(["status", "--run", "mine", "--rejected", "--limit", "5", "--json"], env, cwd=tmp_path)
    got = json.loads(every.stdout)
    assert got["total"] == 13 and [r["row"] for r in got["rejected"]] == [1, 2, 3, 4, 5]
    assert got["rejected"][0]["file"] == str((data / "chats.json").resolve())


def test_a_file_that_yields_no_rows_is_refused_with_the_fix_and_leaves_no_run(settings, s3_env, s3_bucket, sessions,
                                                                             tmp_path, model_folder):
    env = cli_env(settings, s3_env)
    before = _runs(sessions)
    (tmp_path / "empty.json").write_text("[]\n")
    refused = _regen(["submit", "empty.json", "--run", "nothing", "--model", str(model_folder("m")),
                      "--output", f"{s3_bucket}/nothing"], env, cwd=tmp_path, check=False)
    assert refused.returncode != 0
    assert "empty.json: no rows can be read: the file holds no rows" in refused.stderr
    assert "regen reads JSON lines" in refused.stderr and "JSON array" in refused.stderr
    # Rows that are all rejected: refused too, naming them, and the run is gone again.
    (tmp_path / "bad.jsonl").write_text('{"messages": "nope"}\n{not json\n')
    all_bad = _regen(["submit", "bad.jsonl", "--run", "nothing", "--model", str(model_folder("m")),
                      "--output", f"{s3_bucket}/nothing"], env, cwd=tmp_path, check=False)
    assert all_bad.returncode != 0
    assert "no row of the input became a sample" in all_bad.stderr and "bad.jsonl:2 malformed_json" in all_bad.stderr
    assert _runs(sessions) == before


def test_the_write_check_leaves_no_object_behind(s3_env, s3_bucket):
    store = ObjectStore()
    check_output_writable(store, f"{s3_bucket}/probe-run")
    check_output_writable(store, f"{s3_bucket}/probe-run/")
    assert list(store.list(f"{s3_bucket}/probe-run")) == []
