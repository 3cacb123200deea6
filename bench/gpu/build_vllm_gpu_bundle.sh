#!/usr/bin/env bash
# Build the carry for CUDA vLLM 0.26.0 on the lent H200 (python 3.12, torch 2.11.0+cu130).
# usage: build_vllm_gpu_bundle.sh OUT_DIR [one|two]
#   one: OUT_DIR/vllm026-sm90.tar.xz   (~47 MiB; _C's machine code for GPUs other than sm_90 zeroed)
#   two: OUT_DIR/vllm026-a.tar.xz (~23 MiB, all but _C) + OUT_DIR/vllm026-b.tar.xz (~53 MiB, _C untouched)
# Copied from the project's shared/gpu/ recipe so that this repo is self-contained; changes: xz at most
# 2 threads (XZ_CMD overrides, build_carry.sh adds the x86 filter).
set -euo pipefail
XZ_CMD=${XZ_CMD:-xz -9 -T2}
OUT=${1:?OUT_DIR}; MODE=${2:-one}; HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; mkdir -p "$OUT"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none"
for n in $(seq 5 39); do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform any"
# What vLLM 0.26.0 imports on the LLM/AsyncLLM path and the device image lacks (import-tested):
DEPS="annotated-types==0.8.0 apache-tvm-ffi==0.1.10 astor==0.8.1 blake3==1.0.11 cachetools==8.0.2
cbor2==6.3.0 depyf==0.20.0 dill==0.4.1 fastapi==0.136.3 httpcore2==2.16.2 httpx2==2.16.2 jiter==0.19.0
llguidance==1.7.6 msgspec==0.23.0 openai==3.57.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7
pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 pyzmq==27.3.0 setproctitle==1.3.8 sniffio==1.3.1
starlette==1.10.0 truststore==0.10.5 typing-inspection==0.4.5 xgrammar==0.2.7"
export PIP_CONSTRAINT=
python3 -m pip download -q --no-deps $PLAT -d "$W/whl" vllm==0.26.0 $DEPS
python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" $PLAT \
  $(ls "$W"/whl/*.whl | grep -v '/vllm-0')
python3 - "$W"/whl/vllm-0.26.0-*.whl "$W/site" <<'PY'
import sys, zipfile, os
whl, site = sys.argv[1:3]
# Drop what a dense model on sm_90 never loads: FA2 (FA3 is the Hopper default), MoE/MLA/
# Blackwell/FP4 kernels, the Rust frontend binary and the header trees of deep_gemm/fmha_sm100.
drop_prefix = ("vllm/third_party/fmha_sm100/", "vllm/third_party/deep_gemm/")
drop = {"vllm/vllm-rs", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so",
        "vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so", "vllm/_qutlass_C.abi3.so",
        "vllm/_rust_tool_parser.abi3.so"}
z = zipfile.ZipFile(whl)
for m in z.namelist():
    if m in drop or m.startswith(drop_prefix):
        continue
    z.extract(m, site)
PY
C="$W/site/vllm/_C_stable_libtorch.abi3.so"
if [ "$MODE" = one ]; then
  python3 "$HERE/prune_fatbin.py" "$C" "$C.new" 90 && mv "$C.new" "$C"
  tar -C "$W/site" -cf - . | $XZ_CMD > "$OUT/vllm026-sm90.tar.xz"
else
  mkdir "$W/c" && mv "$C" "$W/c/"
  tar -C "$W/site" -cf - . | $XZ_CMD > "$OUT/vllm026-a.tar.xz"
  tar -C "$W/c" -cf - . | $XZ_CMD > "$OUT/vllm026-b.tar.xz"   # extract into site/vllm/
fi
ls -l "$OUT"; sha256sum "$OUT"/*.tar.xz
