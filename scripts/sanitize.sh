#!/usr/bin/env bash
# The sanitizer leg: configures (once) build-asan/ with clang-19, -DHPR_FUZZ=ON
# (ASan + UBSan everywhere, plus the libFuzzer targets), builds it, runs ctest
# and lit there, then every fuzz target for a bounded time (scripts/fuzz.sh).
# --build-only stops after the build; --tests-only runs what follows it on a build
# already made (scripts/check.sh builds in the background while it sets up).
# NDEBUG as in Debian's LLVM: its headers switch statistics (and their ABI) on
# without it. This leg links Debian's LibTorch (build/ takes the venv wheel's),
# so CI builds and tests the TorchScript importer against both.
set -uo pipefail
cd "$(dirname "$0")/.."
build=true tests=true
case "${1:-}" in
  "") ;;
  --build-only) tests=false ;;
  --tests-only) build=false ;;
  *) echo "usage: scripts/sanitize.sh [--build-only | --tests-only]" >&2; exit 2 ;;
esac
jobs="${HPR_JOBS:-$(nproc)}"
if $build; then
  [ -f build-asan/build.ninja ] || cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_COMPILER=clang++-19 -DHPR_FUZZ=ON \
    -DHPR_WHEEL_LIBTORCH=OFF -DHPR_STATIC_LLVM=OFF || exit 1
  ninja -C build-asan -j "$jobs" || exit 1
fi
$tests || exit 0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer UBSAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer
status=0
echo "=== ctest under ASan + UBSan (build-asan) [${SECONDS}s]"
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" || status=1
echo "=== lit under ASan + UBSan (build-asan) [${SECONDS}s]"
/usr/bin/python3 /usr/lib/llvm-19/build/utils/lit/lit.py -sv build-asan/test || status=1
echo "=== fuzzing (bounded, build-asan) [${SECONDS}s]"
bash scripts/fuzz.sh build-asan || status=1
exit $status
