"""The demo's next steps work as printed (issue 59): its S3 outlives it and comes back with its objects,
and the ``regen status`` / ``report`` / ``export`` lines it prints run in a fresh shell as they are.

The demo itself (a tiny model trained, a CPU vLLM worker) takes minutes; these tests take its two
halves that broke: the store, and the printed commands, run against a finished run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from ledger.objects import ObjectStore
from local.demo_s3 import STATE_FILE, demo_s3, stop_demo_s3
from local.s3 import local_s3_env
from tests.support import finished_run as fr
from tests.support.helpers import ROOT, cli_env

_STARTER = """
import os, sys
from pathlib import Path
import boto3
from local.demo_s3 import demo_s3
from local.s3 import local_s3_env
endpoint, started = demo_s3(Path(sys.argv[1]))
os.environ.update(local_s3_env(endpoint))
boto3.client("s3").create_bucket(Bucket="regen-demo")
from ledger.objects import ObjectStore
ObjectStore().put("s3://regen-demo/regen/run/outputs/batch-000001.jsonl.zst", b"kept" * 1000)
print(endpoint, started)
"""


def _demo_module():
    spec = importlib.util.spec_from_file_location("regen_demo", ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_demos_s3_outlives_the_demo_and_a_restart_brings_its_objects_back(tmp_path, monkeypatch):
    folder = tmp_path / ".regen-local"
    key = "s3://regen-demo/regen/run/outputs/batch-000001.jsonl.zst"
    try:
        out = subprocess.run([sys.executable, "-c", _STARTER, str(folder)], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        endpoint, started = out.stdout.split()
        assert started == "True"
        # Its starter is gone; the server answers, with the object.
        for name, value in local_s3_env(endpoint).items():
            monkeypatch.setenv(name, value)
        assert ObjectStore().get(key) == b"kept" * 1000
        # The next demo finds it running: the same endpoint, nothing started.
        assert demo_s3(folder) == (endpoint, False)
        # Stopped (a reboot): the next start replays what was written, on the same port.
        stop_demo_s3(folder)
        again, started_again = demo_s3(folder)
        assert (again, started_again) == (endpoint, True)
        assert ObjectStore(max_attempts=1).get(key) == b"kept" * 1000
        assert json.loads((folder / STATE_FILE).read_text())["endpoint_url"] == endpoint
    finally:
        stop_demo_s3(folder)


@pytest.fixture
def tokenizer(tiny_model):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_model / "tokenizer.json"))


def test_the_next_steps_the_demo_prints_work_as_printed_in_a_fresh_shell(settings, s3_env, s3_bucket, sessions,
                                                                        tokenizer, tiny_model, tmp_path):
    store = ObjectStore(max_attempts=3)
    conversations = [fr.ok("s01"), fr.ok("s02", "b.jsonl", 4), fr.stub("s03"), fr.tool("s04"), fr.failed("s05")]
    fr.build_run(sessions, store, s3_bucket, tokenizer, conversations, name="demo-next", model=str(tiny_model))
    local = tmp_path / ".regen-local"
    local.mkdir()
    lines = _demo_module().next_steps("demo-next", cli_env(settings, s3_env), local=local)
    assert lines[0] == f"source {local / 'demo.env'}"
    assert all(line.startswith(".venv/bin/regen ") for line in lines[1:])
    # A new shell: none of the demo's variables, no virtualenv on the PATH; from the checkout, as printed.
    shell = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path))}
    ran = subprocess.run(["bash", "-c", "set -e\n" + "\n".join(lines)], cwd=ROOT, env=shell, capture_output=True,
                         text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "demo-next" in ran.stdout and (local / "report" / "index.html").is_file()
    manifest = json.loads((local / "train" / "manifest.json").read_text())
    assert manifest["counts"]["samples"] >= 3
