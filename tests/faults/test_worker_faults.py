"""Faults one worker must survive, each injected for real: S3 errors through a fault proxy, poison
samples and shards, a Postgres restart mid-commit, a disallowed message, an engine killed like an OOM,
parsers a worker's vLLM cannot build, an engine a worker cannot build.

One worker process serves the whole module (an engine load costs ~20-60 s); each
test uses its own run. The worker talks to S3 through the fault proxy; the test
itself talks to moto directly.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import subprocess
import sys
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest
import redis as redis_lib
from sqlalchemy import text

from ledger.db import make_engine, make_sessionmaker
from ledger.dispatch import TASK_NAME, make_celery
from ledger.objects import ObjectStore
from ledger.settings import Settings
from local.services import answers
from producer.monitoring.metrics import collect
from producer.run_config import build_run_config
from producer.submit import submit_run
from tests.faults.farm import FAST_RECOVERY, batches_by_status, settled, write_prompts
from tests.fixtures.fault_report import account
from tests.fixtures.worker import EAGER_ENGINE_ARGS, TEST_ENGINE_ENV, WorkerProc, _Descendants
from tests.support.helpers import ROOT, run_cli, wait_for
from tests.support.s3_fault_proxy import FaultProxy

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SECRET = "regen-secret-must-never-be-logged-" + uuid.uuid4().hex[:8]
#: The ledger's and the broker's passwords, in the URLs the worker and the CLI are given: the session's
#: Postgres trusts every connection (it ignores the password), and the broker's is an ACL user of its own.
PG_SECRET = "regen-pg-secret-" + uuid.uuid4().hex[:8]
BROKER_SECRET = "regen-broker-secret-" + uuid.uuid4().hex[:8]
QUEUE = "faults"


@pytest.fixture(scope="module")
def farm(pg_database, redis_server, moto_server, tiny_model, tmp_path_factory):
    """One worker behind an S3 fault proxy, with credentials the test can look for in every output."""
    import boto3

    tmp = tmp_path_factory.mktemp("farm")
    bucket = f"regen-faults-{uuid.uuid4().hex[:10]}"
    direct = {"AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "faultkey", "AWS_SECRET_ACCESS_KEY": SECRET,
              "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
              "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    boto3.client("s3", endpoint_url=moto_server, aws_access_key_id="faultkey", aws_secret_access_key=SECRET,
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    proxy = FaultProxy(moto_server).start()
    settings = Settings(database_url=pg_database, redis_url=redis_server.url)
    broker_user = f"regen-faults-{uuid.uuid4().hex[:8]}"
    admin = redis_lib.Redis.from_url(redis_server.url)
    admin.execute_command("ACL", "SETUSER", broker_user, "on", f">{BROKER_SECRET}", "~*", "&*", "+@all")
    with_secrets = Settings(database_url=_with_password(pg_database, PG_SECRET),
                            redis_url=_with_password(redis_server.url, BROKER_SECRET, user=broker_user))
    env = {**os.environ, **direct, "DATABASE_URL": with_secrets.database_url, "REDIS_URL": with_secrets.redis_url,
           "PYTHONUNBUFFERED": "1", **TEST_ENGINE_ENV}
    worker = _start_worker(tmp, env, proxy, "f", QUEUE, "--model", str(tiny_model))
    engine = make_engine(settings)
    old_env = {k: os.environ.get(k) for k in direct}
    os.environ.update(direct)
    try:
        worker.wait_ready()
        yield {"env": env, "bucket": f"s3://{bucket}", "proxy": proxy, "worker": worker, "tmp": tmp,
               "sessions": make_sessionmaker(engine), "settings": settings, "model": str(tiny_model),
               "settings_with_secrets": with_secrets}
    finally:
        _stop(worker)
        proxy.close()
        engine.dispose()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        admin.execute_command("ACL", "DELUSER", broker_user)
        admin.close()


def _with_password(url: str, password: str, *, user: str | None = None) -> str:
    """``url`` with ``password`` (and ``user``, or the URL's own, or the OS user libpq would take) in its user part."""
    parts = urlsplit(url)
    user = user or parts.username or getpass.getuser()
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def _start_worker(tmp, env: dict, proxy: FaultProxy, node: str, queue: str, *extra: str) -> WorkerProc:
    """A worker launcher on ``queue`` talking to S3 through the fault proxy, its log in ``tmp``."""
    log_path = tmp / f"worker-{node}.log"
    env = {**env, "AWS_ENDPOINT_URL": proxy.endpoint_url}
    proc = subprocess.Popen([sys.executable, "-m", "producer.cli", "worker", "--gpus", "none", "--concurrency", "4",
                             "--queue", queue, "--node-name", node, "--engine-arg", "max_model_len=4096",
                             *EAGER_ENGINE_ARGS, *FAST_RECOVERY, *extra], env=env, cwd=ROOT,
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            start_new_session=True)
    return WorkerProc(name=node, proc=proc, log_path=log_path, env=env, descendants=_Descendants(proc.pid))


def _stop(worker: WorkerProc) -> None:
    worker.stop(timeout_s=60)
    for p in worker.tree():
        p.kill()
    worker.descendants.stop()


def _submit(farm, run: str, n: int, *, batch_size: int = 4, max_tokens: int = 32, long_every: int = 0,
            queue: str = QUEUE):
    data = farm["tmp"] / f"{run}.jsonl"
    ids = write_prompts(data, n, prefix=run[:3], long_every=long_every)
    run_cli(["submit", str(data), "--run", run, "--model", farm["model"], "--output", f"{farm['bucket']}/{run}",
             "--batch-size", str(batch_size), "--max-tokens", str(max_tokens), "--queue", queue], farm["env"])
    return ids


def _wait_settled(farm, run: str, timeout_s: float = 300):
    wait_for(lambda: settled(farm["sessions"], run), timeout_s=timeout_s, what=f"run {run} settled", interval_s=0.5,
             on_timeout=lambda: f"{batches_by_status(farm['sessions'], run)}\n{farm['worker'].log()[-5000:]}")


def _refused_twice(farm, run: str):
    """The run's two batches, once each has been refused at least twice and sits queued again; else None."""
    with farm["sessions"]() as s:
        rows = s.execute(text("SELECT b.attempts, b.failures, b.status, b.error FROM batches b JOIN runs r "
                              "ON r.id = b.run_id WHERE r.name = :n"), {"n": run}).all()
    return rows if len(rows) == 2 and all(r.attempts >= 2 and r.status == "queued" for r in rows) else None


def _failures(farm, run: str) -> int:
    with farm["sessions"]() as s:
        return s.execute(text("SELECT sum(failures) FROM batches b JOIN runs r ON r.id = b.run_id "
                              "WHERE r.name = :n"), {"n": run}).scalar_one()


def _status(farm, run: str) -> dict:
    return json.loads(run_cli(["status", "--run", run, "--json"], farm["env"]).stdout)["runs"][0]


def test_transient_s3_errors_are_retried_and_nothing_is_lost(farm, fault_report):
    proxy = farm["proxy"]
    proxy.fail_next(4, status=503, code="SlowDown", method="PUT")
    proxy.fail_next(2, status=500, code="InternalError", method="HEAD")
    ids = _submit(farm, "s3-transient", 16)
    _wait_settled(farm, "s3-transient")
    row = fault_report("S3 5xx/throttling on uploads", account(farm["sessions"], "s3-transient", expected_ids=ids))
    assert proxy.count(method="PUT", outcome="fail") >= 4
    assert (row.done, row.lost, row.dup_ledger, row.dup_outputs) == (16, 0, 0, 0)


def test_a_permanent_s3_error_fails_the_batch_loudly_then_it_is_dead(farm, fault_report):
    proxy = farm["proxy"]
    proxy.fail_next(1000, status=403, code="AccessDenied", method="PUT")
    try:
        ids = _submit(farm, "s3-denied", 4)
        _wait_settled(farm, "s3-denied")
    finally:
        proxy.clear()
    status = _status(farm, "s3-denied")
    assert status["batches"]["dead"] == 1
    [err] = status["batch_errors"]
    assert err["status"] == "dead" and "AccessDenied" in err["error"] and "permanent" in err["error"]
    # A permanent error is not retried inside an attempt: one PUT per attempt (max-attempts 2).
    assert proxy.count(method="PUT", outcome="fail") <= 2 + 4  # + earlier test's transient ones
    row = fault_report("S3 access denied on upload (permanent)",
                       account(farm["sessions"], "s3-denied", expected_ids=ids))
    # Pending in a dead batch: visible with its error, never silently acknowledged, never lost.
    assert (row.done, row.dead, row.lost) == (0, len(ids), 0)


def test_poison_samples_fail_alone_and_a_poison_shard_dies_after_its_attempts(farm, fault_report):
    ids = _submit(farm, "poison", 12, long_every=5)                 # samples 0, 5, 10 exceed the context
    _wait_settled(farm, "poison")
    status = _status(farm, "poison")
    assert status["samples"]["failed"] == 3 and status["samples"]["done"] == 9
    assert status["failed_reasons"] == {"prompt_too_long": 3}
    row = fault_report("poison samples (prompt > context)", account(farm["sessions"], "poison", expected_ids=ids))
    assert (row.done, row.failed, row.lost) == (9, 3, 0)

    # retry --failed queues them again on request (same sampling), and they fail again for the same reason.
    out = run_cli(["retry", "--run", "poison", "--failed"], farm["env"]).stdout
    assert "3 failed samples queued again in 1 new batches" in out
    _wait_settled(farm, "poison")
    with farm["sessions"]() as s:
        rows = s.execute(text("SELECT b.seq, s.error FROM samples s JOIN batches b ON b.id = s.batch_id "
                              "WHERE s.status = 'failed' AND s.run_id = (SELECT id FROM runs WHERE name = 'poison')")
                         ).all()
    assert len(rows) == 3 and {r.seq for r in rows} == {4} and all(r.error.startswith("prompt_too_long") for r in rows)


def test_a_corrupt_input_shard_kills_only_its_batch_after_max_attempts(farm, fault_report):
    # Submitted to a queue no worker reads, so the shard can be damaged before any worker sees it.
    ids = _submit(farm, "corrupt", 8, batch_size=4, queue="held")
    # Both batches' shards are in one packed object; batch 2's bytes are damaged in place, so
    # batch 1's range still reads and verifies, and batch 2's fails its own SHA-256.
    with farm["sessions"]() as s:
        key, offset, length = s.execute(text(
            "SELECT input_key, input_offset, input_length FROM batches WHERE seq = 2 AND run_id = "
            "(SELECT id FROM runs WHERE name = 'corrupt')")).one()
    store = ObjectStore()
    packed = bytearray(store.get(key))
    packed[offset:offset + length] = (b"\x28\xb5\x2f\xfd garbage" * length)[:length]
    store.put(key, bytes(packed))
    with farm["sessions"].begin() as s:
        s.execute(text("UPDATE runs SET queue = :q WHERE name = 'corrupt'"), {"q": QUEUE})
    run_cli(["requeue", "--run", "corrupt"], farm["env"])
    _wait_settled(farm, "corrupt")
    assert batches_by_status(farm["sessions"], "corrupt") == {"done": 1, "dead": 1}
    [err] = _status(farm, "corrupt")["batch_errors"]
    assert err["failures"] == 2 and "get_range" in err["error"] and "sha256" in err["error"]
    row = fault_report("corrupt input shard", account(farm["sessions"], "corrupt", expected_ids=ids))
    assert (row.done, row.dead, row.lost, row.dup_ledger, row.dup_outputs) == (4, 4, 0, 0, 0)


def test_a_run_whose_parsers_this_workers_vllm_cannot_build_is_refused_with_no_failure_then_served(farm,
                                                                                                 fault_report):
    # A reasoning parser that vLLM's class cannot build on the tiny model's tokenizer (mistral's finds
    # none of its tokens there): what a worker on another vLLM meets, as 0.26's mistral parser refused the
    # Hugging Face tokenizer that 0.32's reads. Counting failures would let such workers kill batches
    # that the rest of a mixed fleet could finish: each refusal is a hand-back instead.
    data = farm["tmp"] / "refused.jsonl"
    ids = write_prompts(data, 8, prefix="ref")
    run_cli(["submit", str(data), "--run", "refused", "--model", farm["model"], "--output",
             f"{farm['bucket']}/refused", "--batch-size", "4", "--max-tokens", "16", "--reasoning-parser", "mistral",
             "--tool-parser", "none", "--queue", QUEUE], farm["env"])

    rows = wait_for(lambda: _refused_twice(farm, "refused"), timeout_s=120, what="both batches refused twice", interval_s=0.5,
                    on_timeout=lambda: farm["worker"].log()[-4000:])
    assert {r.failures for r in rows} == {0}
    assert all(r.error.startswith("refused by cpu0@f: ") and "cannot build the run's parsers" in r.error for r in rows), rows
    # `regen status` says why the run waits: both batches refused, by the one worker, for that reason.
    status = wait_for(lambda: (s := _status(farm, "refused"))["refused"] and s["refused"][0]["batches"] == 2 and s,
                      timeout_s=30, what="status counting both refusals", interval_s=0.2)
    [refused] = status["refused"]
    assert refused["workers"] == 1 and "'mistral'" in refused["reason"] and not refused["reason"].startswith("refused")
    assert status["samples"] == {**status["samples"], "done": 0, "failed": 0, "pending": 8}
    text_out = run_cli(["status", "--run", "refused"], farm["env"]).stdout
    assert "REFUSED" in text_out and "no failure counted" in text_out
    assert "refused: this worker's vLLM cannot build the run's parsers" in farm["worker"].log()
    # The exporter's gauge, for an alert (a batch is claimed again every ~5 s: between two claims, both show).
    wait_for(lambda: _refused_gauge(farm, "refused") == [2], timeout_s=30, what="regen_refused_batches at 2",
             interval_s=0.2)

    # A worker that can build them takes the batches (here: the record names parsers this vLLM builds),
    # and nothing was lost or counted against the batches on the way.
    with farm["sessions"].begin() as s:
        s.execute(text("""UPDATE runs SET sampling = sampling || '{"reasoning_parser": "qwen3"}'::jsonb """
                       "WHERE name = 'refused'"))
    _wait_settled(farm, "refused")
    row = fault_report("run parsers this worker's vLLM cannot build",
                       account(farm["sessions"], "refused", expected_ids=ids))
    assert (row.done, row.failed, row.dead, row.lost, row.dup_ledger, row.dup_outputs) == (8, 0, 0, 0, 0, 0)
    assert _failures(farm, "refused") == 0
    assert _status(farm, "refused")["refused"] == []
    assert _refused_gauge(farm, "refused") == [0]


def test_a_worker_that_cannot_build_its_engine_refuses_batches_and_exits_instead_of_killing_them(farm,
                                                                                                 fault_report):
    # A misconfigured node (here a KV cache CPU tier of a PiB, which regen refuses before vLLM pins it:
    # worker/engine/kv_tier.py) used to fail every batch it took after each load: with --max-attempts 2
    # two such tries killed a batch the rest of the farm could finish. Its engine is built on the first
    # batch (no --model), so the refusal comes from a delivery.
    data, queue = farm["tmp"] / "unbuilt.jsonl", f"broken-{uuid.uuid4().hex[:6]}"
    ids = write_prompts(data, 8, prefix="unb")
    run_cli(["submit", str(data), "--run", "unbuilt", "--model", farm["model"], "--output",
             f"{farm['bucket']}/unbuilt", "--batch-size", "4", "--max-tokens", "16", "--queue", queue], farm["env"])
    broken = _start_worker(farm["tmp"], farm["env"], farm["proxy"], "b", queue, "--engine-arg", f"kv_offloading_size={2**20}")
    try:
        rows = wait_for(lambda: _refused_twice(farm, "unbuilt"), timeout_s=240, what="both batches refused twice", interval_s=0.5,
                        on_timeout=lambda: broken.log()[-5000:])
        assert {r.failures for r in rows} == {0}, rows  # before: each try a failure, dead after 2
        assert all(r.error.startswith("refused by cpu0@b: this worker could not build its engine")
                   and "kv_offloading_size=1048576" in r.error for r in rows), rows
        log = broken.log()
        assert "worker exiting: this worker could not build its engine" in log
        assert "restarting in" in log, "the launcher restarts the process that exited, with its back-off"
        assert broken.proc.poll() is None, "the launcher itself keeps running"
        # Between a restarted process's claim and its refusal a batch shows running, its error cleared: wait.
        status = wait_for(lambda: (s := _status(farm, "unbuilt"))["refused"] and s, timeout_s=60,
                          what="status counting the refusals", interval_s=0.2)
        assert "could not build its engine" in status["refused"][0]["reason"]
    finally:
        _stop(broken)

    # The node fixed (the same worker without the bad argument): everything is served, nothing lost.
    fixed = _start_worker(farm["tmp"], farm["env"], farm["proxy"], "b2", queue)
    try:
        _wait_settled(farm, "unbuilt", timeout_s=300)
    finally:
        _stop(fixed)
    row = fault_report("worker that cannot build its engine", account(farm["sessions"], "unbuilt", expected_ids=ids))
    assert (row.done, row.failed, row.dead, row.lost, row.dup_ledger, row.dup_outputs) == (8, 0, 0, 0, 0, 0)
    assert _failures(farm, "unbuilt") == 0


def _is_engine_core(p: psutil.Process) -> bool:
    try:
        return "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()
    except psutil.NoSuchProcess:  # a short-lived helper that ended between the listing and this look
        return False


def _refused_gauge(farm, run: str) -> list[float]:
    scrape = {m.name: m for m in collect(farm["settings"])}
    return [s.value for s in scrape["regen_refused_batches"].samples if s.labels == {"run": run}]


def test_an_uploaded_batch_is_recorded_after_a_postgres_restart_not_generated_again(farm, pg_server, fault_report):
    # Stops the session's Postgres: skipped (saying why) where it is the machine's, shared with others.
    pg_server.require_own()
    # The proxy holds the batch's output upload until Postgres is down: the test acts inside the
    # upload step instead of racing a generation time (timed versions of this test went from
    # queued to done between two polls when `regen submit` returned late, twice in CI).
    store = ObjectStore()
    out_key = f"{farm['bucket']}/pg-restart/outputs/batch-000001.jsonl.zst"
    release = farm["proxy"].hold_next(1, method="PUT", path_contains="/pg-restart/outputs/")
    try:
        ids = _submit(farm, "pg-restart", 8, batch_size=8, max_tokens=160)
        wait_for(lambda: farm["proxy"].count(method="PUT", outcome="hold"), timeout_s=120,
                 what="the batch's upload reaching S3", interval_s=0.1,
                 on_timeout=lambda: f"{batches_by_status(farm['sessions'], 'pg-restart')}\n"
                                    f"{farm['worker'].log()[-5000:]}")
        assert batches_by_status(farm["sessions"], "pg-restart") == {"running": 1}
        assert not store.exists(out_key), "the upload is held: nothing may be in S3 yet"
        farm["sessions"].kw["bind"].dispose()
        pg_server.stop()  # a fast shutdown, as `pg_ctl stop -m fast`: the worker's connections are cut
    finally:
        release.set()
    try:
        # The worker uploads while the ledger is down; its commit waits with back-off.
        wait_for(lambda: store.exists(out_key), timeout_s=240, what="the output shard uploaded", interval_s=0.5,
                 on_timeout=lambda: farm["worker"].log()[-4000:])
        time.sleep(3)
        assert not answers(pg_server.host, pg_server.port), "Postgres must still be down"
    finally:
        pg_server.start()
    _wait_settled(farm, "pg-restart", timeout_s=180)
    with farm["sessions"]() as s:
        b = s.execute(text("SELECT attempts, output_sha256 FROM batches b JOIN runs r ON r.id = b.run_id "
                           "WHERE r.name = 'pg-restart'")).one()
    assert b.attempts == 1, "the uploaded batch must be committed, not generated again"
    from ledger.objects import sha256_hex

    assert b.output_sha256 == sha256_hex(store.get(out_key))
    assert "ledger write" in farm["worker"].log()   # the retries were logged
    row = fault_report("Postgres stopped during a batch", account(farm["sessions"], "pg-restart", expected_ids=ids))
    assert (row.done, row.lost, row.dup_ledger, row.dup_outputs) == (8, 0, 0, 0)


def test_a_pickled_message_is_refused_and_secrets_appear_nowhere(farm):
    app = make_celery(farm["settings"])
    app.send_task(TASK_NAME, kwargs={"run": "x", "run_id": 1, "batch_id": 999999, "seq": 1, "input_key": "s3://x/y"},
                  queue=QUEUE, serializer="pickle")
    wait_for(lambda: "disallowed" in farm["worker"].log().lower(), timeout_s=30,
             what="the worker refusing a pickle message", interval_s=0.5)
    # Something of its own in every place looked at, even when this test runs alone: a run the worker
    # generates (ledger rows, its log), and one on a queue no worker reads (its messages stay in Redis).
    # Submitted in process (a CLI call costs seconds), through the URLs that carry the passwords.
    secret_settings = farm["settings_with_secrets"]
    secret_engine = make_engine(secret_settings)
    try:
        for run, queue in (("secrets", QUEUE), ("secrets-held", "secrets-held")):
            data = farm["tmp"] / f"{run}.jsonl"
            write_prompts(data, 2, prefix=run)
            submit_run(make_sessionmaker(secret_engine), make_celery(secret_settings), ObjectStore(), [str(data)],
                       run_name=run, config=build_run_config(farm["model"], max_tokens=8),
                       output_url=f"{farm['bucket']}/{run}", batch_size=2, queue=queue)
    finally:
        secret_engine.dispose()
    _wait_settled(farm, "secrets")
    with farm["sessions"]() as s:
        assert s.execute(text("SELECT count(*) FROM batches WHERE id = 999999")).scalar() == 0
        ledger_text = " ".join(s.scalars(text(
            "SELECT t::text FROM (SELECT to_jsonb(r) AS t FROM runs r UNION ALL SELECT to_jsonb(b) FROM batches b "
            "UNION ALL SELECT to_jsonb(x) FROM samples x UNION ALL SELECT to_jsonb(j) FROM rejected_rows j) AS rows")))
    assert "secrets-held" in ledger_text and '"status": "done"' in ledger_text
    broker = _everything_in(redis_lib.Redis.from_url(farm["settings"].redis_url))
    assert redis_lib.Redis.from_url(farm["settings"].redis_url).llen("secrets-held") == 1, "the held run's message"
    log = farm["worker"].log()
    assert "batch" in log and "committed" in log
    secrets = {"S3 secret": SECRET, "S3 access key": "faultkey", "ledger password": PG_SECRET,
               "broker password": BROKER_SECRET}
    for where, blob in (("worker log", log), ("ledger", ledger_text), ("broker", broker)):
        for what, secret in secrets.items():
            assert secret not in blob, f"the {what} leaked into the {where}"


def _everything_in(client: redis_lib.Redis) -> str:
    """Every key of the broker's database and what it holds, as text."""
    parts = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        value = {"string": lambda k: client.get(k), "list": lambda k: client.lrange(k, 0, -1),
                 "hash": lambda k: client.hgetall(k), "set": lambda k: client.smembers(k),
                 "zset": lambda k: client.zrange(k, 0, -1)}.get(kind, lambda k: b"")(key)
        parts.append(f"{key!r} {value!r}")
        for item in value if kind == "list" else ():
            parts.append(_message_body(item))
    return "\n".join(parts)


def _message_body(raw: bytes) -> str:
    """A kombu message's body, decoded: Redis holds it base64-encoded, where a plain search would miss a secret."""
    try:
        message = json.loads(raw)
        if message.get("properties", {}).get("body_encoding") == "base64":
            return base64.b64decode(message["body"]).decode("utf-8", "replace")
    except (ValueError, AttributeError, KeyError):
        pass
    return ""


def test_an_engine_killed_like_an_oom_sends_its_batch_back_and_the_worker_restarts(farm, fault_report):
    worker = farm["worker"]
    # ~32 K tokens: several seconds of generation, so the kill lands mid-batch (16 x 200
    # tokens once finished between two polls on a quiet machine and the wait timed out).
    ids = _submit(farm, "oom", 32, batch_size=4, max_tokens=1000)
    wait_for(lambda: batches_by_status(farm["sessions"], "oom").get("running"), timeout_s=120,
             what="batches running", interval_s=0.1,
             on_timeout=lambda: f"{batches_by_status(farm['sessions'], 'oom')}\n{worker.log()[-5000:]}")
    engines = [p for p in worker.tree() if _is_engine_core(p)]
    assert engines, [p.pid for p in worker.tree()]
    before = len([line for line in worker.log().splitlines() if "started cpu0@f" in line])
    engines[0].kill()
    _wait_settled(farm, "oom", timeout_s=600)
    log = worker.log()
    assert len([line for line in log.splitlines() if "started cpu0@f" in line]) == before + 1, \
        "the launcher restarts the worker process once"
    assert "the engine died" in log
    assert worker.proc.poll() is None, "the launcher itself keeps running"
    with farm["sessions"]() as s:
        failures = s.execute(text("SELECT sum(failures) FROM batches b JOIN runs r ON r.id = b.run_id "
                                  "WHERE r.name = 'oom'")).scalar()
    assert failures <= 1, "one engine death charges at most one batch"
    row = fault_report("engine process killed (OOM)", account(farm["sessions"], "oom", expected_ids=ids))
    assert (row.done, row.lost, row.dup_ledger, row.dup_outputs) == (32, 0, 0, 0)
    # This worker's processes only: another test session's (an xdist neighbour's) may be orphaned on purpose now.
    assert not _orphaned_engines(worker)


def _orphaned_engines(worker: WorkerProc) -> list[psutil.Process]:
    """Engine processes the worker ever had that outlived their parent (re-parented to init)."""
    orphans = []
    for p in worker.descendants.live():
        try:
            if p.ppid() == 1 and "EngineCore" in p.name():
                orphans.append(p)
        except psutil.NoSuchProcess:
            pass
    return orphans


