#!/usr/bin/env bash
# Builds hp-recompute into build/ with Ninja: the tools, the extension and the tests.
# scripts/setup.sh's editable install into .venv configures and builds it there first
# (so after setup this only rebuilds what changed); without setup, it configures here.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${HPR_JOBS:-$(nproc)}"
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$PWD/.venv/bin/python"
ninja -C build -j "$jobs"
