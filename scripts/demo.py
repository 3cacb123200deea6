"""A real regeneration of the bundled sample on this machine: CPU, tiny model, every part real.

Starts what is missing (a moto S3 server when no S3 endpoint is configured; says
exactly what to start for Postgres or Redis), migrates the ledger, builds the tiny
model, submits data/sample, runs one worker until every sample is done, prints
``regen status`` and where the outputs are. Run through scripts/demo.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ledger.local_s3 import LocalS3, start_local_s3

ROOT = Path(__file__).resolve().parents[1]


def regen(*args: str, env: dict, capture: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "producer.cli", *args]
    print("$ regen " + " ".join(args), flush=True)
    return subprocess.run(cmd, env=env, check=True, text=True, capture_output=capture, cwd=ROOT)


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def check_services(env: dict) -> None:
    import psycopg
    import redis

    try:
        psycopg.connect(env["DATABASE_URL"].replace("postgresql+psycopg", "postgresql"), connect_timeout=3).close()
    except psycopg.OperationalError as e:
        if "does not exist" in str(e):
            admin = env["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
            name = env["DATABASE_URL"].rsplit("/", 1)[1]
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(f'CREATE DATABASE "{name}"')
            print(f"created database {name}")
        else:
            sys.exit(f"Postgres is not reachable at {env['DATABASE_URL']} ({e}).\n"
                     "Start it: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n"
                     "or set DATABASE_URL=postgresql://user@host:port/db")
    try:
        redis.Redis.from_url(env["REDIS_URL"], socket_connect_timeout=3).ping()
    except redis.RedisError as e:
        sys.exit(f"Redis is not reachable at {env['REDIS_URL']} ({e}).\n"
                 "Start it: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no\n"
                 "or set REDIS_URL=redis://host:port/db")


def start_moto(env: dict) -> LocalS3 | None:
    if env.get("AWS_ENDPOINT_URL"):
        return None
    server = start_local_s3()
    env.update(server.env())
    print(f"no AWS_ENDPOINT_URL set: started a local moto S3 server on {env['AWS_ENDPOINT_URL']}")
    return server


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
        import hashlib

        key = f"{Path(args.model_dir).resolve()}|{args.variant}|{args.max_tokens}|{args.data}"
        args.run = "demo-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    env = dict(os.environ)
    env.setdefault("DATABASE_URL", "postgresql://127.0.0.1:5432/regen")
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    check_services(env)
    moto = start_moto(env)
    worker = None
    try:
        import boto3

        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        s3 = boto3.client("s3")
        try:
            s3.create_bucket(Bucket=args.bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        regen("db", "upgrade", env=env)
        regen("tiny-model", args.model_dir, "--variant", args.variant, env=env)
        output = f"s3://{args.bucket}/regen/{args.run}"
        regen("submit", args.data, "--run", args.run, "--model", args.model_dir,
              "--output", output, "--batch-size", "32", "--max-tokens", args.max_tokens, "--seed", "0", env=env)
        print("$ regen worker --gpus none   (until every sample is done)", flush=True)
        worker = subprocess.Popen([sys.executable, "-m", "producer.cli", "worker", "--gpus", "none",
                                   "--engine-arg", "max_model_len=4096"], env=env, cwd=ROOT,
                                  start_new_session=True)
        deadline = time.monotonic() + args.timeout_s
        while time.monotonic() < deadline:
            out = regen("status", "--run", args.run, "--json", env=env, capture=True).stdout
            run = json.loads(out)["runs"][0]
            s = run["samples"]
            print(f"  {s['done']} done, {s['failed']} failed, {s['pending']} pending", flush=True)
            if s["pending"] == 0 and run["batches"]["running"] == 0:
                break
            if run["status"] == "paused":
                regen("status", "--run", args.run, env=env)
                sys.exit(f"the quality gate paused the run: {run['status_reason']}\n"
                         f"look at `regen report --run {args.run} --out report/`, then `regen resume --run "
                         f"{args.run} [--force]`")
            if worker.poll() is not None:
                sys.exit("the worker exited early; see its log above")
            time.sleep(5)
        else:
            sys.exit(f"not finished after {args.timeout_s:.0f}s")
        regen("status", "--run", args.run, env=env)
        print(f"\noutputs: {output}/outputs/  (JSONL + zstd, one row per sample; endpoint {env['AWS_ENDPOINT_URL']})")
        print(f"ledger:  psql {env['DATABASE_URL']} -c \"select status, count(*) from samples group by 1\"")
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=120)
        if moto is not None:
            moto.stop()


if __name__ == "__main__":
    main()
