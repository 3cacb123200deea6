"""A refused ``regen submit`` leaves the ledger as it was, and the corrected submit under the same name proceeds.

Each case is tried as a user would (the real CLI against the real Postgres, Redis and moto S3,
or a service that is not there), and each asserts the one line said and that ``runs`` did not
change (issue 36, part 5). A step that fails after the checks (S3 or Redis gone mid-submit) is
tried through ``submit_run`` itself, against a store and a broker that do not answer.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from sqlalchemy import text

from ledger.dispatch import make_celery
from ledger.errors import ConfigError, StoreError
from ledger.objects import ObjectStore
from ledger.settings import Settings
from producer.run_config import build_run_config
from producer.submit import submit_run
from tests.support.helpers import cli_env, run_cli
from tests.support.model_folder import write_model_folder

#: Nothing listens here: a service that is down.
DEAD = "127.0.0.1:1"


def _write(path, n=5):
    path.write_text("".join(json.dumps({"id": f"u{i}", "messages": [{"role": "user", "content": f"hi {i}"}]}) + "\n"
                            for i in range(n)))
    return path


def _runs(sessions) -> list:
    with sessions() as s:
        return [tuple(r) for r in s.execute(text("SELECT id, name, model, status, config_hash FROM runs ORDER BY id"))]


def _refused(args: list[str], env: dict) -> str:
    """Run a submit that must be refused: exit 2, one line on stderr, no traceback; that line."""
    proc = run_cli(args, env, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture
def submit_args(s3_bucket, tmp_path, model_folder):
    data = _write(tmp_path / "a.jsonl")

    def args(run: str, **overrides: str) -> list[str]:
        given = {"--run": run, "--model": str(model_folder("m")), "--output": f"{s3_bucket}/{run}", **overrides}
        paths = given.pop("paths", str(data))
        return ["submit", paths, *[x for kv in given.items() for x in kv], "--batch-size", "2"]

    return args


@pytest.fixture
def existing(settings, s3_env, sessions, submit_args):
    """A run already in the ledger, so that "unchanged" is a comparison with something."""
    run_cli(submit_args("kept"), cli_env(settings, s3_env))
    before = _runs(sessions)
    assert [r[1] for r in before] == ["kept"]
    return before


def test_a_missing_input_file_is_refused_before_the_run_exists(settings, s3_env, sessions, existing, submit_args):
    line = _refused(submit_args("y1", paths="/nonexistent.jsonl"), cli_env(settings, s3_env))
    assert "/nonexistent.jsonl: no such file or folder" in line
    assert _runs(sessions) == existing


def test_a_missing_model_is_refused_and_the_corrected_submit_proceeds_under_the_same_name(
        settings, s3_env, sessions, existing, submit_args, model_folder, tmp_path):
    env = cli_env(settings, s3_env)
    line = _refused(submit_args("y2", **{"--model": "/nonexistent/model"}), env)
    assert "--model /nonexistent/model: no such folder" in line
    assert _runs(sessions) == existing
    # A folder that is not a chat model's, and a hub id this offline machine cannot confirm.
    no_template = write_model_folder(tmp_path / "base-model", chat_template="")
    line = _refused(submit_args("y2", **{"--model": str(no_template)}), env)
    assert "has no chat template" in line
    line = _refused(submit_args("y2", **{"--model": "no-org/no-such-model"}), {**env, "HF_HUB_OFFLINE": "1"})
    assert "--model no-org/no-such-model" in line and "hf download no-org/no-such-model" in line
    assert _runs(sessions) == existing
    # The same name, the right model: created, as if nothing had been tried before.
    out = run_cli(submit_args("y2"), env)
    assert "run y2 (created)" in out.stdout
    assert [r[1] for r in _runs(sessions)] == ["kept", "y2"]


def test_a_bad_bucket_name_is_refused_before_the_run_exists(settings, s3_env, sessions, existing, submit_args):
    line = _refused(submit_args("y3", **{"--output": "s3://b/y3"}), cli_env(settings, s3_env))
    assert "'s3://b/y3' does not name a valid S3 bucket" in line
    assert _runs(sessions) == existing


def test_an_s3_that_does_not_answer_is_refused_in_one_line_naming_the_endpoint(settings, s3_env, sessions, existing,
                                                                               submit_args):
    env = {**cli_env(settings, s3_env), "AWS_ENDPOINT_URL": f"http://{DEAD}"}
    line = _refused(submit_args("y4"), env)
    assert "cannot be written" in line and f"S3 at http://{DEAD}" in line and "AWS_ENDPOINT_URL" in line
    assert _runs(sessions) == existing


def test_a_redis_that_does_not_answer_is_refused_in_one_line_naming_it(settings, s3_env, sessions, existing,
                                                                       submit_args):
    line = _refused(submit_args("y5"), {**cli_env(settings, s3_env), "REDIS_URL": f"redis://{DEAD}/0"})
    assert f"the broker at redis://{DEAD}/0 does not answer" in line and "REDIS_URL" in line
    assert _runs(sessions) == existing


@pytest.fixture
def unmigrated(pg_server):
    """A database of the session's Postgres with no migration applied."""
    with pg_server.bare_database("regen_bare") as dsn:
        yield dsn


def test_a_ledger_not_migrated_or_not_there_is_said_in_one_line_by_submit_and_status(settings, s3_env, unmigrated,
                                                                                     submit_args):
    env = {**cli_env(settings, s3_env), "DATABASE_URL": unmigrated}
    line = _refused(submit_args("y6"), env)
    assert "at migration (none)" in line and "regen db upgrade" in line
    with psycopg.connect(unmigrated) as conn:
        assert conn.execute("SELECT to_regclass('runs')").fetchone()[0] is None  # submit created nothing
    line = _refused(["status"], env)
    assert "is not migrated" in line and "regen db upgrade" in line
    down = {**env, "DATABASE_URL": f"postgresql://regen@{DEAD}/regen"}
    for args in (submit_args("y6"), ["status"]):
        line = _refused(args, down)
        assert f"cannot reach the ledger at postgresql://regen@{DEAD}/regen" in line and "DATABASE_URL" in line
    # --debug keeps the traceback for whoever needs it.
    debug = run_cli(["--debug", "status"], env, check=False)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "UndefinedTable" in debug.stderr


def test_a_submit_whose_store_or_broker_fails_after_the_checks_leaves_no_run(settings, s3_env, s3_bucket, sessions,
                                                                            model_folder, tmp_path, monkeypatch):
    data = _write(tmp_path / "late.jsonl")
    config = build_run_config(str(model_folder("m")), max_tokens=64)
    args = {"run_name": "late", "config": config, "output_url": f"{s3_bucket}/late", "batch_size": 2, "queue": "regen"}
    before = _runs(sessions)
    # S3 that stopped answering after the checks: the run's manifest cannot be written.
    with monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", f"http://{DEAD}")
        with pytest.raises(StoreError):
            submit_run(sessions, make_celery(settings), ObjectStore(max_attempts=1), [str(data)], **args)
    assert _runs(sessions) == before
    # Redis that stopped answering: the first publish fails, and the run goes with it.
    gone = Settings(database_url=settings.database_url, redis_url=f"redis://{DEAD}/0")
    with pytest.raises(Exception) as failed:  # noqa: PT011 - whatever the broker raises, the run must go
        submit_run(sessions, make_celery(gone), ObjectStore(), [str(data)], **args)
    assert _runs(sessions) == before, failed.value
    # Both back: the same name proceeds.
    report = submit_run(sessions, make_celery(settings), ObjectStore(), [str(data)], **args)
    assert report.created and report.samples_new == 5



def test_a_new_run_on_another_runs_output_prefix_is_refused_naming_that_run(settings, s3_env, s3_bucket, sessions,
                                                                           existing, submit_args, model_folder,
                                                                           tmp_path):
    # The same prefix, as a user types it: one line naming the run, nothing created.
    line = _refused(submit_args("y7", **{"--output": f"{s3_bucket}/kept"}), cli_env(settings, s3_env))
    assert f"overlaps the output of run kept ({s3_bucket}/kept)" in line
    assert "give run 'y7' an --output prefix of its own" in line
    assert _runs(sessions) == existing
    # Inside it or around it (in process: a CLI call costs seconds): the new run would find "kept"'s shards.
    data, config = _write(tmp_path / "b.jsonl"), build_run_config(str(model_folder("m")), max_tokens=64)

    def submit(output: str):
        return submit_run(sessions, make_celery(settings), ObjectStore(), [str(data)], run_name="y7", config=config,
                          output_url=output, batch_size=2, queue="regen")

    for output in (f"{s3_bucket}/kept/inner", s3_bucket):
        with pytest.raises(ConfigError, match=f"overlaps the output of run kept \\({s3_bucket}/kept\\)"):
            submit(output)
    assert _runs(sessions) == existing
    # A sibling whose name merely starts alike is a prefix of its own.
    assert submit(f"{s3_bucket}/kept2").created
