#!/usr/bin/env bash
# Builds hp-recompute into build/ with Ninja: the tools, the extension and the tests.
# scripts/setup.sh's editable install into .venv configures build/ and builds the tools and
# the extension there first; this turns the tests on in that same build (they then stay on)
# and builds what is left, so nothing is compiled twice. Without setup, it configures here.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${HPR_JOBS:-$(nproc)}"
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PWD/.venv/bin/python"
elif ! grep -qx 'HPR_BUILD_TESTS:BOOL=ON' build/CMakeCache.txt; then
  cmake -B build -DHPR_BUILD_TESTS=ON > /dev/null
fi
ninja -C build -j "$jobs"
