#!/usr/bin/env bash
# Sets up, builds and runs every test: gtest (through ctest), lit + FileCheck,
# pytest twice (on every core): under the venv's torch 2.x (.venv, the primary target) and under
# Debian's python3-torch (.venv-system, a venv over /usr/bin/python3), the wheel
# (scripts/check_wheel.sh: packed from build/, installed into a fresh venv, run with
# /usr/lib/llvm-19 hidden), and the sanitizer leg (ctest and lit again under ASan + UBSan
# in build-asan/, then bounded libFuzzer runs: scripts/sanitize.sh). Each runner prints its own summary; the script fails if any did.
# Each leg's header says how long the script has run (CI's budget is 25 minutes on 2 cores).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --system-torch --wheel build/dist || exit 1
bash scripts/build.sh || exit 1

status=0
echo "=== ctest (gtest unit tests) [${SECONDS}s]"
ctest --test-dir build --output-on-failure -j "$(nproc)" || status=1
echo "=== lit (FileCheck tests) [${SECONDS}s]"
/usr/bin/python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv build/test || status=1
# Both venvs hold the package installed editable (scripts/setup.sh): no PYTHONPATH. The
# suite runs on every core (pytest-xdist): its tests share no file, port or cache.
for python in .venv/bin/python .venv-system/bin/python; do
  echo "=== pytest (python/) on $("$python" -c 'import torch; print("torch", torch.__version__)') ($python) [${SECONDS}s]"
  "$python" -m pytest -q -p no:cacheprovider -n "$(nproc)" test/python || status=1
done
echo "=== the wheel, installed anywhere (scripts/check_wheel.sh) [${SECONDS}s]"
bash scripts/check_wheel.sh build/dist/hp_recompute-*.whl || status=1
echo "=== sanitizers and fuzzing (scripts/sanitize.sh) [${SECONDS}s]"
bash scripts/sanitize.sh || status=1
echo "=== done [${SECONDS}s], exit $status"
exit $status
