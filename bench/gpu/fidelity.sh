#!/usr/bin/env bash
# The fidelity suites on the GPU machine's vLLM (CUDA 0.26.0), not the CPU build's 0.32 that CI runs (issue 31,
# item 7): prompt ids against a fresh rendering, loss masks, parsed calls, multi-turn conversations continued past
# spliced tool results, thinking on and off, for regen's template, the published families' and gpt-oss's Harmony.
# A difference between the two vLLM versions' parsers or engine APIs shows up here and not in CI.
#
# usage on the GPU machine, carrying vllm026-sm90.tar.xz and deps.tar.xz (and their .sha256),
# o200k_base.tiktoken.xz for the Harmony suite (below) and mistral.tar.xz for the mistral and magistral cases:
#   . bench/gpu/unpack.sh >/dev/null && bash bench/gpu/fidelity.sh [pytest args]
# or, being longer than one call (the tiny models train there first, on the CPU: their cache key names the
# torch and transformers versions, so this machine's cached ones do not apply), through detached.sh:
#   . bench/gpu/unpack.sh >/dev/null && bash bench/gpu/detached.sh start 570 bash bench/gpu/fidelity.sh
# Writes $OUT/fidelity-gpu.txt: the versions it ran on, then pytest's report (-rs names every skip; the export
# tests' drafter trainers, specforge and speculators, are not in the carry and skip there). Exit: pytest's.
set -uo pipefail
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp}
export REGEN_CACHE_DIR=${REGEN_CACHE_DIR:-/tmp/regen-cache}   # the tiny models, built once per machine
cd "$(dirname "$0")/../.."
# vLLM 0.26's openai-harmony downloads o200k_base.tiktoken on first use; this machine has no network. With
# .gpu-carry/o200k_base.tiktoken.xz carried (bench/gpu/harmony_vocab.py), it reads the file from here.
VOCAB=.gpu-carry/o200k_base.tiktoken.xz
if [ -z "${TIKTOKEN_ENCODINGS_BASE:-}" ] && [ -f "$VOCAB" ]; then
  export TIKTOKEN_ENCODINGS_BASE=/tmp/regen-tiktoken
  mkdir -p "$TIKTOKEN_ENCODINGS_BASE" && "$PY" -c "import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
    "$VOCAB" > "$TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken"
fi
# The suites start their engines in the pytest process, after building tiny models (regen's trained one in that
# process). On the H200 (2026-12-04) every engine core vLLM forked from it failed "CUDA error: initialization
# error": something there had touched CUDA without torch counting it as initialized, so vLLM kept its default fork. spawn starts
# the engine core clean. A worker (`regen worker`) trains nothing and touches no CUDA before its engine, and
# forks fine (every GPU run of the whole system).
export VLLM_WORKER_MULTIPROC_METHOD=${VLLM_WORKER_MULTIPROC_METHOD:-spawn}
# --prebuild: only build the suites' tiny models into the cache, on the CPU (bench/gpu/prebuild_tiny.py), e.g. in the
# background while a GPU benchmark runs; a later plain run then finds them built.
if [ "${1:-}" = --prebuild ]; then
  shift
  CUDA_VISIBLE_DEVICES= exec "$PY" -m bench.gpu.prebuild_tiny "$@"
fi
{
  "$PY" - <<'PYEOF'
import importlib, subprocess
for name in ("vllm", "torch", "transformers", "openai_harmony"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '(no version)')}")
    except ImportError as e:
        print(f"{name}: not importable ({e})")
try:
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout.strip() or "nvidia-smi: no GPU listed")
except (OSError, subprocess.TimeoutExpired) as e:
    print(f"nvidia-smi: {e}")
PYEOF
  # Which families' parsers this vLLM builds, each on its family's own tokenizer, before any suite runs
  # (bench/gpu/parser_check.py): a package the machine lacks (vLLM 0.26's mistral parsers need ijson and
  # mistral_common: carry mistral.tar.xz) or a class that refuses the tokenizer shows here once, up front.
  "$PY" -m bench.gpu.parser_check
  echo "TIKTOKEN_ENCODINGS_BASE=${TIKTOKEN_ENCODINGS_BASE:-(not set)} VLLM_WORKER_MULTIPROC_METHOD=$VLLM_WORKER_MULTIPROC_METHOD"
  # One pytest process a suite, one after another. On a GPU each engine takes most of the card (0.95 of an empty
  # one, worker/engine/gpu_memory.py; vLLM's 0.92 otherwise) and vLLM refuses to start with less free than that.
  # In one process the session's shared engine (tests/fixtures/engine.py, alive to the session's end) would hold
  # the card while the family and Harmony suites start theirs. On the CPU build the cache is a fixed 1 GiB
  # (TEST_ENGINE_ENV), which is why CI can run them together.
  worst=0
  # FIDELITY_SUITES: which suites, in which order (all three by default), for a call short of device time.
  for suite in ${FIDELITY_SUITES:-test_fidelity test_family_fidelity test_harmony_fidelity}; do
    echo "== tests/integration/$suite.py"
    "$PY" -m pytest -p no:cacheprovider -q -rs --durations=10 "tests/integration/$suite.py" "$@"
    rc=$?
    echo "== $suite: exit $rc"
    [ "$rc" -gt "$worst" ] && worst=$rc
  done
  exit "$worst"
} 2>&1 | tee "$OUT/fidelity-gpu.txt"
exit "${PIPESTATUS[0]}"
