#!/usr/bin/env bash
# Make a virtualenv with pip in it, with whatever this Python allows (scripts/install.sh's first step).
# Usage: PYTHON=python3 scripts/make_venv.sh VENV_DIR
#
# Stock Debian and Ubuntu split venv's ensurepip into python3.X-venv, which a minimal image lacks:
# `python3 -m venv` then fails (or leaves a folder with no pip in it). In order:
#   1. python -m venv
#   2. virtualenv, where this Python has it
#   3. uv venv --seed, where uv is on PATH
#   4. virtualenv fetched with the pip this Python has, into a throwaway folder (--target: neither the
#      system's packages nor PEP 668's EXTERNALLY-MANAGED are touched)
#   5. else: the one apt line to run, and exit 1
set -euo pipefail
VENV="${1:?usage: scripts/make_venv.sh VENV_DIR}"
PYTHON="${PYTHON:-python3}"
PYV=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

works() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }
made() { echo "virtualenv: $VENV ($1)"; exit 0; }
fresh=0
[ -e "$VENV" ] || fresh=1
discard() { if [ "$fresh" = 1 ]; then rm -rf "$VENV"; fi; }  # never a folder that was there before
helper=""
trap 'if [ -n "$helper" ]; then rm -rf "$helper"; fi' EXIT

works && made "already there"
"$PYTHON" -m venv "$VENV" >/dev/null 2>&1 && works && made "python$PYV -m venv"
discard
"$PYTHON" -m virtualenv --version >/dev/null 2>&1 && "$PYTHON" -m virtualenv -q "$VENV" >/dev/null && works \
  && made "virtualenv; python$PYV has no ensurepip"
discard
command -v uv >/dev/null && uv venv -q --seed --python "$PYTHON" "$VENV" && works \
  && made "uv venv; python$PYV has no ensurepip"
discard
if "$PYTHON" -m pip --version >/dev/null 2>&1; then
  helper=$(mktemp -d)
  "$PYTHON" -m pip install -q --disable-pip-version-check --target "$helper" virtualenv >/dev/null 2>&1 \
    && PYTHONPATH="$helper" "$PYTHON" -m virtualenv -q "$VENV" >/dev/null && works \
    && made "virtualenv fetched with pip; python$PYV has no ensurepip"
  discard
fi
echo "make_venv.sh: python$PYV can make no virtualenv here: no ensurepip (Debian's python$PYV-venv), no virtualenv,
no pip, and no uv on PATH. Run, as root:

    apt-get install -y python$PYV-venv

then run this again." >&2
exit 1
