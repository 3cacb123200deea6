#!/usr/bin/env bash
# Set up and run a real regeneration of data/sample on this machine (CPU, tiny model).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/.installed ] || { scripts/install.sh .venv && touch .venv/.installed; }
exec .venv/bin/python scripts/demo.py "$@"
