"""Small helpers shared by integration tests: run the CLI, wait for a condition, read outputs."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ledger.objects import ObjectStore
from ledger.shards import decode_packed, decode_shard

ROOT = Path(__file__).resolve().parents[2]


def require(module: str, hint: str, *, module_level: bool = False):
    """Import ``module``, an installed package a test needs (``make test`` installs every one).

    Missing, it skips the test with ``hint`` (what to install) on a developer's machine, and
    fails it under CI (``CI`` set): a CI machine that lost a package is never green by skipping.
    """
    import pytest

    try:
        return importlib.import_module(module)
    except ImportError as e:
        message = f"{module} is not installed ({e}): {hint}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=module_level)


def cli_env(settings, s3_env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **s3_env, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}


def run_cli(args: list[str], env: dict[str, str], *, check: bool = True, timeout_s: float = 300
            ) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "producer.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise AssertionError(f"regen {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


class BackgroundCli:
    """A regen command run in a thread, so a test can watch what it starts while it runs.

    A fault test that must catch its workers mid-batch cannot wait for ``regen submit`` to return:
    the submit publishes first and exits later, and on a loaded machine a short run's batches were
    done before it had (seen: 12 batches in 18 s, the wait for "a running" never true). ``check()``
    re-raises the command's failure at once, so a predicate that calls it stops the wait.
    """

    def __init__(self, args: list[str], env: dict[str, str], *, timeout_s: float = 300):
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(args, env, timeout_s), daemon=True,
                                        name="background-cli")
        self._thread.start()

    def _run(self, args, env, timeout_s) -> None:
        try:
            run_cli(args, env, timeout_s=timeout_s)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread by check()/join()
            self._error = e

    def check(self) -> bool:
        """Raise the command's failure if it failed; False (so ``check() or ...`` reads the rest)."""
        if self._error is not None:
            raise self._error
        return False

    def join(self, timeout_s: float = 300) -> None:
        """Wait for the command to end; raise its failure."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"the background regen command still runs after {timeout_s:.0f} s")
        self.check()


def status_json(env: dict[str, str], run: str, *, via_cli: bool = False) -> dict:
    """``regen status --run RUN --json``'s run, read in this process unless ``via_cli``.

    In-process by default: tests poll it every second or two while workers run, and each
    ``regen status`` process costs ~1 s of CPU (the interpreter, psycopg, the CLI), half a core
    of the two that the engines need. The same functions the command calls, and the same JSON
    round trip, so the dict is what the command prints; tests that assert the command itself
    pass ``via_cli=True`` (or call run_cli).
    """
    if via_cli:
        out = run_cli(["status", "--run", run, "--json"], env).stdout
        return json.loads(out)["runs"][0]
    from ledger.reads import connect
    from ledger.settings import Settings
    from producer.monitoring.status import run_status

    settings = Settings(database_url=env["DATABASE_URL"], redis_url=env["REDIS_URL"])
    with connect(settings) as conn:
        runs = run_status(conn, run, broker_url=settings.redis_url)
    assert runs, f"regen status: no run {run!r}"
    return json.loads(json.dumps(runs[0], default=str))


def wait_for(predicate: Callable[[], object], *, timeout_s: float, what: str, interval_s: float = 1.0,
             on_timeout: Callable[[], str] | None = None):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{extra}")
        time.sleep(interval_s)


def stop_process(proc: subprocess.Popen, *, timeout_s: float = 60.0) -> None:
    """SIGTERM, as a supervisor stops a worker; SIGKILL if it has not exited within ``timeout_s``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def output_rows(store: ObjectStore, output_url: str) -> list[dict]:
    rows = []
    for url in sorted(store.list(output_url.rstrip("/") + "/outputs/")):
        rows.extend(decode_shard(store.get(url)))
    return rows


def input_rows(store: ObjectStore, output_url: str) -> list[dict]:
    """Every input row, in batch order: packed group objects and single-batch shards alike."""
    rows = []
    for url in sorted(store.list(output_url.rstrip("/") + "/inputs/"), key=_first_seq):
        rows.extend(decode_packed(store.get(url)))
    return rows


def _first_seq(url: str) -> int:
    # group-000033.jsonl.zst and batch-000042.jsonl.zst: both named by their (first) batch.
    return int(url.rsplit("-", 1)[1].split(".", 1)[0])


def refuse_reasoning_parsers(monkeypatch, error: Exception) -> None:
    """Make every reasoning parser class vLLM names refuse to be built, raising ``error``: a class that
    imports and then refuses the model's tokenizer, as vLLM 0.26's mistral one did (tests/data/vllm026)."""
    import targets.vllm_compat as compat

    class Refuses:
        def __init__(self, tokenizer, *args, **kwargs):
            raise error

    monkeypatch.setattr(compat, "reasoning_parser_class", lambda name: Refuses)
