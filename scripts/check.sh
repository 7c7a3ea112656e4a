#!/usr/bin/env bash
# Sets up, builds and runs every test: gtest (through ctest), lit + FileCheck,
# pytest twice (on every core): under the venv's torch 2.x (.venv, the primary target) and under
# Debian's python3-torch (.venv-system, a venv over /usr/bin/python3), the wheel
# (scripts/check_wheel.sh: packed from build/, installed into a fresh venv, run with
# /usr/lib/llvm-19 hidden), and the sanitizer leg (ctest and lit again under ASan + UBSan
# in build-asan/, then bounded libFuzzer runs: scripts/sanitize.sh). Each runner prints its own summary; the script fails if any did.
# Each leg's header says how long the script has run (CI's budget is 25 minutes on 2 cores).
#
# The sanitizer build (build-asan/, ~400 s of CPU) runs in the background at the lowest
# priority from the moment the Debian packages are in: the venvs' installs leave a core idle,
# which it takes (from a fresh clone it is done before the tests begin; the tests keep both
# cores busy). Its output is printed when the sanitizer leg begins.
set -uo pipefail
cd "$(dirname "$0")/.."
cpu_ticks() { awk '/^cpu /{total = 0; for (i = 2; i <= NF; i++) total += $i; print $5 + $6, total}' /proc/stat; }
read -r idle_start total_start < <(cpu_ticks)
bash scripts/setup.sh --packages-only || exit 1
mkdir -p build-asan
asan_log=build-asan/build.log
setsid nice -n 19 bash scripts/sanitize.sh --build-only >"$asan_log" 2>&1 &
asan_build=$!  # its own process group: stopped with the script (a failed setup leaves nothing building)
trap 'kill -- -"$asan_build" 2>/dev/null' EXIT
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
wait "$asan_build"
asan_status=$?
echo "--- the sanitizer build (in the background since setup) ended [${SECONDS}s]:"
if [ $asan_status -eq 0 ]; then
  tail -n 3 "$asan_log"
  bash scripts/sanitize.sh --tests-only || status=1
else
  cat "$asan_log"
  echo "the sanitizer build failed (exit $asan_status)"
  status=1
fi
read -r idle_end total_end < <(cpu_ticks)
echo "=== done [${SECONDS}s], exit $status; the cores were idle" \
  "$(( 100 * (idle_end - idle_start) / (total_end - total_start) ))% of the time"
exit $status
