#!/usr/bin/env bash
# Runs bench_eager.py under both torches, one after the other: the venv's torch 2.x
# (scripts/setup.sh makes .venv) and Debian's python3-torch. Extra flags go to both.
set -euo pipefail
cd "$(dirname "$0")/../.."
for python in .venv/bin/python /usr/bin/python3; do
  "$python" bench/eager/bench_eager.py "$@"
  echo
done
