#!/usr/bin/env bash
# Put this machine's PgBouncer into the GPU carry, for bench/farm.py on the lent machine (which has no
# PgBouncer and no package index): .gpu-carry/pgbouncer/pgbouncer, a wrapper that runs the binary with
# the shared libraries it was linked against (all but glibc's, copied beside it: ~10 MB), so it does not
# depend on what the image has. Needs /usr/sbin/pgbouncer here (apt-get install pgbouncer).
# Usage (repo root): bash bench/gpu/carry_pgbouncer.sh    then carry ".gpu-carry/pgbouncer"
set -euo pipefail
binary=${PGBOUNCER:-$(command -v pgbouncer || echo /usr/sbin/pgbouncer)}
[ -x "$binary" ] || { echo "carry_pgbouncer.sh: no pgbouncer binary (apt-get install pgbouncer)" >&2; exit 1; }
out=${GPU_CARRY:-$(pwd)/.gpu-carry}/pgbouncer
rm -rf "$out"
mkdir -p "$out/lib"
cp -L "$binary" "$out/lib/pgbouncer.bin"
# Every library ldd resolves, but the C library and the loader: those must be the image's own.
ldd "$binary" | awk '/=> \// {print $3}' | grep -v -E '/(libc|libm|libdl|libpthread|librt)\.so|ld-linux' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cat > "$out/pgbouncer" <<'WRAP'
#!/bin/sh
# The carried PgBouncer with its own libraries (bench/gpu/carry_pgbouncer.sh).
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/lib/pgbouncer.bin" "$@"
WRAP
chmod +x "$out/pgbouncer"
"$out/pgbouncer" --version >&2
du -sb "$out" | awk '{printf "carry_pgbouncer.sh: %s bytes in %s\n", $1, $2}' >&2
