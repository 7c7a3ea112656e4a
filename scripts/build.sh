#!/usr/bin/env bash
# Configures (once) and builds hp-recompute into build/ with Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${HPR_JOBS:-$(nproc)}"
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$PWD/.venv/bin/python"
ninja -C build -j "$jobs"
