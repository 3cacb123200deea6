"""``regen worker``'s plan: which processes a node starts, on which devices, with which names and arguments."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from ledger.errors import ConfigError
from producer.cli import main
from worker.process import launcher
from worker.process.launcher import parse_gpus, plan_processes


def _arg(plan, flag: str) -> str:
    argv = list(plan.argv)
    return argv[argv.index(flag) + 1]


def _engine_args(plan) -> list[str]:
    argv = list(plan.argv)
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--engine-arg"]


def test_four_gpus_with_tensor_parallel_two_plan_two_processes_on_pairs_of_devices():
    plans = plan_processes(parse_gpus("0,1,2,3"), tp=2, host="node7", base_env={"PATH": "/usr/bin"})
    assert [p.name for p in plans] == ["gpu0-1@node7", "gpu2-3@node7"]
    assert [p.devices for p in plans] == [("0", "1"), ("2", "3")]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["0,1", "2,3"]
    for plan in plans:
        assert plan.argv[:3] == (sys.executable, "-m", "worker.process.consumer")
        assert _arg(plan, "--name") == plan.name
        assert _engine_args(plan) == ["tensor_parallel_size=2"]
        assert plan.env["PATH"] == "/usr/bin"


def test_one_gpu_per_process_without_tensor_parallel():
    plans = plan_processes(["0", "1", "5"], tp=1, host="h", base_env={})
    assert [(p.name, p.env["CUDA_VISIBLE_DEVICES"]) for p in plans] == [("gpu0@h", "0"), ("gpu1@h", "1"),
                                                                        ("gpu5@h", "5")]
    assert all(_engine_args(p) == [] for p in plans)


def test_no_gpu_plans_one_cpu_process_with_a_kv_cache_size():
    (plan,) = plan_processes(parse_gpus("none"), host="laptop", base_env={})
    assert plan.name == "cpu0@laptop" and plan.devices == ()
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "" and plan.env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    (kept,) = plan_processes(None, host="laptop", base_env={"VLLM_CPU_KVCACHE_SPACE": "12"})
    assert kept.env["VLLM_CPU_KVCACHE_SPACE"] == "12"   # the operator's choice wins


def test_queues_concurrency_model_engine_and_extra_args_reach_every_process():
    plans = plan_processes(["0", "1"], tp=1, host="h", queues="qwen,regen", concurrency=4, model="/models/q",
                           engine_args=["max_model_len=8192"], extra_args=["--lease-s", "120"], base_env={})
    for plan in plans:
        assert _arg(plan, "--queues") == "qwen,regen" and _arg(plan, "--concurrency") == "4"
        assert _arg(plan, "--model") == "/models/q" and _arg(plan, "--lease-s") == "120"
        assert _engine_args(plan) == ["max_model_len=8192"]


def test_an_explicit_tensor_parallel_engine_arg_is_not_doubled():
    (plan,) = plan_processes(["0", "1"], tp=2, host="h", engine_args=["tensor_parallel_size=2"], base_env={})
    assert _engine_args(plan) == ["tensor_parallel_size=2"]


def test_each_process_gets_its_own_environment():
    base = {"A": "1"}
    first, second = plan_processes(["0", "1"], tp=1, host="h", base_env=base)
    assert first.env is not second.env and base == {"A": "1"}


@pytest.mark.parametrize("spec, gpus", [("none", None), ("cpu", None), ("", None), (" NONE ", None),
                                        ("0", ["0"]), ("0, 2,3", ["0", "2", "3"]), ("3,1", ["3", "1"])])
def test_gpu_specs_that_parse(spec, gpus):
    assert parse_gpus(spec) == gpus


@pytest.mark.parametrize("spec", ["a,b", "0,0", "-1", "1.5", "0;1", "gpu0"])
def test_bad_gpu_specs_are_rejected(spec):
    with pytest.raises(ConfigError, match="--gpus expects"):
        parse_gpus(spec)


@pytest.mark.parametrize("gpus, tp", [(["0", "1", "2"], 2), (["0", "1"], 0), (["0"], 2), (["0", "1"], -1)])
def test_gpus_that_do_not_split_into_tensor_parallel_groups_are_rejected(gpus, tp):
    with pytest.raises(ConfigError, match="cannot be split"):
        plan_processes(gpus, tp=tp, host="h", base_env={})


def test_all_uses_the_discovered_gpus_and_fails_when_there_are_none(monkeypatch):
    # nvidia-smi cannot run here: the discovery is replaced, the parsing around it is real.
    monkeypatch.setattr(launcher, "discover_gpus", lambda: ["0", "1", "2", "3"])
    assert parse_gpus("all") == ["0", "1", "2", "3"]
    monkeypatch.setattr(launcher, "discover_gpus", lambda: [])
    with pytest.raises(ConfigError, match="no GPU found"):
        parse_gpus("all")


def test_dry_run_prints_the_plan():
    result = CliRunner().invoke(main, ["worker", "--gpus", "0,1,2,3", "--tp", "2", "--node-name", "n7", "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("gpu0-1@n7  CUDA_VISIBLE_DEVICES='0,1'")
    assert lines[1].startswith("gpu2-3@n7  CUDA_VISIBLE_DEVICES='2,3'")
    assert "--engine-arg tensor_parallel_size=2" in lines[0]


def test_engine_args_written_as_pairs_read_back_the_same():
    from worker.engine.args import format_engine_args, parse_engine_args

    args = {"max_model_len": 8192, "load_format": "dummy", "enable_prefix_caching": True, "gpu_memory_utilization": 0.9,
            "quoted": "a=b c"}
    assert parse_engine_args(format_engine_args(args)) == args
