"""``--engine-arg key=value`` pairs to vLLM engine keyword arguments.

A module of its own so the estimate probe and the worker process share it without
the probe importing the Celery process module.
"""

from __future__ import annotations

import json

from ledger.errors import ConfigError


def parse_engine_args(pairs: list[str]) -> dict:
    """``key=value`` pairs; values are JSON when they parse (numbers, booleans), else strings.

    Raises:
        ConfigError: a pair without ``=``.
    """
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--engine-arg expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except ValueError:
            out[key.replace("-", "_")] = value
    return out


def format_engine_args(args: dict) -> list[str]:
    """``key=value`` pairs that :func:`parse_engine_args` reads back as ``args`` (values as JSON)."""
    return [f"{key}={json.dumps(value)}" for key, value in args.items()]
