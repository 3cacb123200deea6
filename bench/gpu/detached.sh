#!/usr/bin/env bash
# Run one command on the lent GPU machine for longer than one device call (600 s at most).
#
# Why: a whole-system run and a bare run of the same 30,720 requests, each with its own engine
# load, take 520-640 s on an H200 machine (loads of 80-140 s each), so the printed ratio of one
# invocation does not fit one call. The device tool ends what a call leaves running, except a
# process in a session of its own, which runs on until the machine goes back (after 30 s with
# no call in flight). So: `start` launches the command in a new session and waits for it; if the
# call's time runs out first, the next call's `wait` (issued at once) waits for the rest.
#
# The command runs in a copy of the repo (with .gpu-carry and the unpacked .gpu-site) of its own,
# $DETACHED_DIR/tree: each call copies the working tree onto the machine again, and a command
# reading its code or vLLM's from the tree being copied can fail (once, the bare engine's shutdown
# could not import a vLLM module while the second call began; the figures were already taken).
#
# usage, on the GPU machine, from the repo root, after `. bench/gpu/unpack.sh &&`:
#   bash bench/gpu/detached.sh start SECONDS COMMAND [ARGS...]   first call: start, wait up to SECONDS
#   bash bench/gpu/detached.sh wait SECONDS                      each later call
# The command's output goes to $DETACHED_DIR/log (default /tmp/regen-detached); it runs with
# OUT=$DETACHED_DIR, so what it keeps "in $OUT" (bench.gpu.throughput's worker logs) lands there
# too. Each `start`/`wait` copies that folder (less the tree) to the call's $OUT and prints the
# log's end. Exit status: the command's, once it has ended; 3 while it still runs.
set -euo pipefail
DIR=${DETACHED_DIR:-/tmp/regen-detached}
what=${1:?usage: detached.sh start SECONDS COMMAND... | wait SECONDS}
limit=${2:?seconds to wait}
shift 2

if [ "$what" = start ]; then
  [ $# -gt 0 ] || { echo "detached.sh: start needs a command" >&2; exit 2; }
  if [ -f "$DIR/pid" ] && [ ! -f "$DIR/rc" ] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; then
    echo "detached.sh: a command is still running in $DIR (pid $(cat "$DIR/pid"))" >&2; exit 2
  fi
  rm -rf "$DIR" && mkdir -p "$DIR/tree"
  printf '%q ' "$@" > "$DIR/command"
  tar --exclude=./.git --exclude=./.venv -cf - . | tar -C "$DIR/tree" -xf -
  # setsid: a session of its own, so the end of this call does not end it. unpack.sh, sourced in
  # the copy (its parts are already unpacked there), points PYTHONPATH and PATH at the copy.
  OUT=$DIR setsid bash -c 'cd "$OUT/tree" && {
      if [ -f bench/gpu/unpack.sh ] && [ -d .gpu-site ]; then . bench/gpu/unpack.sh && "$@"; else "$@"; fi
    } > "$OUT/log" 2>&1; echo $? > "$OUT/rc.tmp"; mv "$OUT/rc.tmp" "$OUT/rc"' detached "$@" \
    < /dev/null > /dev/null 2>&1 &
  echo $! > "$DIR/pid"
elif [ "$what" != wait ]; then
  echo "detached.sh: start or wait, not $what" >&2; exit 2
fi
[ -d "$DIR" ] || { echo "detached.sh: nothing was started in $DIR (a fresh machine?)" >&2; exit 2; }

t0=$SECONDS
while [ ! -f "$DIR/rc" ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 2; done
if [ -n "${OUT:-}" ]; then
  for f in "$DIR"/*; do [ "$f" = "$DIR/tree" ] || cp -r "$f" "$OUT"/ 2>/dev/null || true; done
fi
# vLLM's CUDA-graph progress bars are one very long line each: left out of the tail.
grep -v 'Capturing CUDA graphs' "$DIR/log" | tail -c 6000 || true
if [ -f "$DIR/rc" ]; then
  echo "detached.sh: ended with status $(cat "$DIR/rc") after this wait of $((SECONDS - t0)) s"
  exit "$(cat "$DIR/rc")"
fi
echo "detached.sh: still running after this wait of $((SECONDS - t0)) s; call 'wait' again now"
exit 3
