#!/usr/bin/env bash
# The one prepared device check (bench/gpu/README.md): device tests, the eager bench on
# the device, runner steps of the bundled GPT on ZBV (jit and bubble plans, checked in under
# bench/gpu/plans/), and a side-stream prefetch overlap with its profiler trace; prints one
# table and writes it to bench/gpu/results-DATE.md (and to $OUT when set). Needs no C++
# build, no network and no venv: a python3 whose torch sees CUDA (PYTHON=... overrides).
#
# Usage: bash bench/gpu/run.sh [--dry-run] [--out DIR] [--verbose]
#   --dry-run   every check on the CPU at tiny sizes (CUDA-only tests skip), under ~60 s;
#               writes only under --out (default: a temporary folder), never into bench/gpu/
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

dry=0
for arg in "$@"; do
  [ "$arg" = "--dry-run" ] && dry=1
done

# The interpreter: $PYTHON, else the first python3 whose torch has CUDA (any torch for a dry run).
if [ "$dry" = 1 ]; then
  probe='import torch'
else
  probe='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'
fi
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for cand in python3 "$repo/.venv/bin/python" /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "$probe" >/dev/null 2>&1; then
      py="$cand"
      break
    fi
  done
fi
if [ -z "$py" ]; then
  if [ "$dry" = 1 ]; then
    echo "hp_recompute: bench/gpu/run.sh: no python3 with torch found; set PYTHON=/path/to/python" >&2
  else
    echo "hp_recompute: bench/gpu/run.sh: no python3 whose torch sees a CUDA device (tried python3, .venv," \
         "/usr/bin/python3, /usr/local/bin/python3, /opt/conda/bin/python3); set PYTHON=..., or run" \
         "bash bench/gpu/run.sh --dry-run on a machine without one" >&2
  fi
  exit 2
fi

extra=()
if [ "$dry" = 1 ]; then
  has_out=0
  for arg in "$@"; do [ "$arg" = "--out" ] && has_out=1; done
  if [ "$has_out" = 0 ]; then
    tmp="$(mktemp -d)"
    extra+=(--out "$tmp")
  fi
else
  extra+=(--results "$here/results-$(date +%F).md")
  has_out=0
  for arg in "$@"; do [ "$arg" = "--out" ] && has_out=1; done
  [ "$has_out" = 0 ] && extra+=(--out "${OUT:-$here/out}")
fi
exec "$py" "$here/check.py" "$@" "${extra[@]}"
