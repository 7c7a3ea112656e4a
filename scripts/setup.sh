#!/usr/bin/env bash
# Installs what hp-recompute needs to build, test and run: Debian packages (apt-get),
# then the project venv .venv with torch 2.x and the Python test and build dependencies,
# pinned in requirements.txt, and the project itself into it (pip install -e .). With
# --system-torch (scripts/check.sh) also .venv-system, a venv over Debian's Python whose
# own python3-torch (1.13 on Debian 12, 2.6 on Debian 13) is the second torch the Python
# suite runs on. With --wheel DIR (scripts/check_wheel.sh) it then also writes the
# self-contained wheel (docs/install.md) into DIR, from the same build. Safe to rerun: it
# installs no package that is already present (the project's editable install rebuilds
# incrementally). --packages-only stops after the Debian packages (scripts/check.sh starts
# the sanitizer build then, beside the venvs' installs).
set -euo pipefail
cd "$(dirname "$0")/.."
system_torch=false
packages_only=false
wheel_dir=
while [ $# -gt 0 ]; do
  case "$1" in
    --system-torch) system_torch=true ;;
    --packages-only) packages_only=true ;;
    --wheel) [ $# -ge 2 ] || { echo "setup: --wheel needs a folder" >&2; exit 2; }
             wheel_dir=$2; shift ;;
    *) echo "usage: scripts/setup.sh [--system-torch] [--wheel DIR] | --packages-only" >&2; exit 2 ;;
  esac
  shift
done

packages=(
  cmake ninja-build g++ git
  llvm-19-dev llvm-19-tools libmlir-19-dev mlir-19-tools
  clang-format-19  # the C++ style check (ctest clang-format)
  clang-19 libclang-rt-19-dev  # the sanitizer and libFuzzer build (build-asan, fuzz/)
  libtorch-dev python3-torch
  python3-dev  # the Python extension hp_recompute._planner (nanobind)
  nlohmann-json3-dev libminizip-dev zlib1g-dev
  googletest libgtest-dev
  python3-pytest python3-pytest-xdist python3-jsonschema python3-hypothesis python3-venv
  librsvg2-bin python3-pil  # render --emit svg to PNG and check its pixels (lit)
  time  # /usr/bin/time, for the bench scripts
  ccache  # the second venv's build reuses the first's objects (below)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

echo "setup: Debian $(cat /etc/debian_version 2>/dev/null || echo '(unknown)')"
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
else
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
fi
$packages_only && exit 0

# The venv is built from Debian's /usr/bin/python3, so both torches run the same Python.
# A stamp with the requirements' hash tells whether the venv is current.
stamp=.venv/requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "setup: .venv current ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
else
  echo "setup: creating .venv from requirements.txt"
  rm -rf .venv
  /usr/bin/python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
  echo "$want" > "$stamp"
  echo "setup: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
fi

# .venv-system (--system-torch): a venv over Debian's python3 that sees its packages
# (python3-torch 1.13, python3-pytest, ...), with the build requirements.
if $system_torch && { [ ! -x .venv-system/bin/python ] || \
   [ "$(cat .venv-system/requirements.sha256 2>/dev/null)" != "$(sha256sum requirements-build.txt | cut -d' ' -f1)" ]; }; then
  echo "setup: creating .venv-system (Debian's python3 and its torch, with requirements-build.txt)"
  rm -rf .venv-system
  /usr/bin/python3 -m venv --system-site-packages .venv-system
  .venv-system/bin/python -m pip install -q --disable-pip-version-check -r requirements-build.txt
  sha256sum requirements-build.txt | cut -d' ' -f1 > .venv-system/requirements.sha256
fi

# The project itself, editable, into both venvs (pyproject.toml: scikit-build-core builds
# the planner, incrementally): hp-recompute-plan, hp-recompute-opt, hp_recompute and its
# extension then work from either venv with no PYTHONPATH. No build isolation: the build
# tools are pinned, and the TorchScript importer links the venv's own LibTorch.
# The planner is compiled once: .venv's install builds into build/ (the tools and the
# extension; the tests too once scripts/build.sh has turned them on there, so that a
# rerun keeps them), and .venv-system's into build-venv-system/ through ccache, whose
# cache (build-ccache/, paths relative to the checkout) holds build/'s objects: only the
# TorchScript importer, which includes the other LibTorch, and the extension, which
# includes the other venv's nanobind, compile again. The wheel (--wheel) is packed from
# build/ with the same settings, so nothing compiles for it.
launcher="/usr/bin/env;CCACHE_DIR=$PWD/build-ccache;CCACHE_BASEDIR=$PWD;ccache"
tests=OFF
grep -qx 'HPR_BUILD_TESTS:BOOL=ON' build/CMakeCache.txt 2>/dev/null && tests=ON
pip_build() {  # venv, build folder, whether it builds the tests too, then pip's command
  local venv=$1 dir=$2 with_tests=$3
  shift 3
  "$venv/bin/python" -m pip "$@" -q --disable-pip-version-check --no-build-isolation --no-deps \
    --config-settings=build-dir="$dir" --config-settings=cmake.define.HPR_BUILD_TESTS="$with_tests" \
    --config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER="$launcher" \
    --config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER="$launcher" \
    > "$venv/pip-build.log" 2>&1 || { cat "$venv/pip-build.log"; exit 1; }
}
echo "setup: installing hp-recompute into .venv (pip install -e ., built in build/)"
pip_build .venv build "$tests" install -e .
if $system_torch; then
  echo "setup: installing hp-recompute into .venv-system (pip install -e ., built in build-venv-system/)"
  pip_build .venv-system build-venv-system OFF install -e .
fi
if [ -n "$wheel_dir" ]; then
  echo "setup: writing the wheel into $wheel_dir (pip wheel ., from build/)"
  rm -rf "$wheel_dir"
  pip_build .venv build "$tests" wheel -w "$wheel_dir" .
fi
