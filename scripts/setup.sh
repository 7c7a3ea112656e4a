#!/usr/bin/env bash
# Installs every Debian package hp-recompute needs to build, test and run.
# Safe to rerun: it installs nothing when everything is already present.
set -euo pipefail

packages=(
  cmake ninja-build g++ git
  llvm-19-dev llvm-19-tools libmlir-19-dev mlir-19-tools
  libtorch-dev python3-torch
  nlohmann-json3-dev
  googletest libgtest-dev
  python3-pytest python3-jsonschema
  time  # /usr/bin/time, for the bench scripts
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
