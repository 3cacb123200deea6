"""docker-compose.yml read as compose reads it, without a docker engine.

The file is parsed as YAML and interpolated as compose does it (``${VAR}``, ``${VAR:-default}``,
``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``, ``$VAR``, ``$$``), with the values of
.env.example plus dummy secrets, as an operator's ``.env`` would give them. Shared by the
compose checks (tests/unit/test_compose.py) and the test that runs the pgbouncer service's
configuration against a real PgBouncer (tests/integration/test_pgbouncer_compose.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"

DUMMY_SECRETS = {"POSTGRES_PASSWORD": "pg0dummy", "REDIS_PASSWORD": "redis0dummy", "REGEN_S3_ACCESS_KEY": "s3dummy",
                 "REGEN_S3_SECRET_KEY": "s3secret0dummy", "FLOWER_PASSWORD": "flower0dummy"}

_VAR = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
                  r"|(?P<named>[A-Za-z_]\w*))")


class MissingVariable(KeyError):
    pass


def interpolate(value, env: dict[str, str]):
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(m: re.Match) -> str:
        if m["escaped"]:
            return "$"
        name, op, arg = m["braced"] or m["named"], m["op"] or "", m["arg"] or ""
        val = env.get(name)
        missing = (not val) if op.startswith(":") else val is None
        if not op or not missing:
            return val or ""
        if op.endswith("-"):
            return arg
        raise MissingVariable(f"{name}: {arg}")

    return _VAR.sub(substitute, value)


def raw_values(node) -> list[str]:
    """Every string value under ``node``: what compose interpolates (comments and keys are not)."""
    if isinstance(node, dict):
        return [s for v in node.values() for s in raw_values(v)]
    if isinstance(node, list):
        return [s for v in node for s in raw_values(v)]
    return [node] if isinstance(node, str) else []


def referenced_variables() -> dict[str, set[str]]:
    """Each variable the compose file interpolates, with the operators (and defaults) it is used with."""
    out: dict[str, set[str]] = {}
    for m in _VAR.finditer("\n".join(raw_values(yaml.safe_load(COMPOSE.read_text())))):
        if not m["escaped"]:
            out.setdefault(m["braced"] or m["named"], set()).add((m["op"] or "") + (m["arg"] or "" if m["op"] == ":-" else ""))
    return out


def env_example() -> tuple[dict[str, str], set[str]]:
    """The example's active ``NAME=value`` lines, and every name it documents (commented ones too)."""
    active, documented = {}, set()
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = re.match(r"^(#\s*)?([A-Z_][A-Z0-9_]*)=(.*)$", line.strip())
        if m:
            documented.add(m[2])
            if not m[1]:
                active[m[2]] = m[3]
    return active, documented


def dummy_env(**overrides: str) -> dict[str, str]:
    active, _ = env_example()
    return {**active, **DUMMY_SECRETS, **overrides}


def load_compose(env: dict[str, str] | None = None) -> dict:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), dummy_env() if env is None else env)
