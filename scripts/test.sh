#!/usr/bin/env bash
# `make test` for a machine without make: install .venv if needed, then run the Makefile's own `test`
# recipe (scripts/make_recipe.py reads it, so the two never differ).
# Usage: scripts/test.sh [PYTEST_ARGS...]   e.g. scripts/test.sh tests/unit   (VENV=... as with make)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
export VENV
if [ ! -f "$VENV/.installed" ]; then  # as scripts/demo.sh: rm "$VENV/.installed" to reinstall
  scripts/install.sh "$VENV"
  touch "$VENV/.installed"
fi
exec "$VENV/bin/python" scripts/make_recipe.py test "$@"
