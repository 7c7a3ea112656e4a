#!/usr/bin/env bash
# The wheel check (scripts/check.sh; docs/install.md): takes the wheel WHEEL, or packs one from build/
# (scripts/setup.sh --wheel, the build that the editable install and the tests share, so nothing
# compiles for it), then checks that it installs anywhere:
#   - auditwheel names a manylinux tag for it;
#   - every ELF file in it needs nothing beyond glibc, libstdc++, libgcc_s and libz (readelf -d), but
#     the mlir-opt-19 plugin (Debian's libMLIR/libLLVM, which the mlir-opt-19 that loads it has);
#   - installed into a fresh venv with torch 2.13 from requirements.txt, hp-recompute-plan (the JSON,
#     torch.export and TorchScript readers), hp-recompute-opt, the extension and a runner step work
#     in a private mount namespace where /usr/lib/llvm-19 is an empty tmpfs (unshare -m), and so is
#     the lib/ folder of the torch the wheel was built with (.venv's): the TorchScript importer
#     loads the LibTorch of the torch installed beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/wheel-venv
if [ $# -eq 0 ]; then
  bash scripts/setup.sh --wheel build/dist
  set -- build/dist/hp_recompute-*.whl
fi
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: scripts/check_wheel.sh [WHEEL] (one wheel; got: $*)" >&2; exit 2; }
wheel=$1
echo "check_wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB"

# auditwheel, on what a machine one trains on has: only glibc, libstdc++, libgcc_s and libz are
# where it looks (a folder of links to them), not this machine's other libraries (Debian's own
# libtorch-dev would pass for the torch package's libraries, and bring its dependencies).
[ -x .venv/bin/auditwheel ] || { echo "check_wheel: .venv has no auditwheel (requirements.txt pins it; rerun scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/ld" "$work/wheel"
for soname in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2 \
              libstdc++.so.6 libgcc_s.so.1 libz.so.1; do
  ln -s "$(ldconfig -p | awk -v s="$soname" '$1 == s && /x86-64/ {print $NF; exit}')" "$work/ld/$soname"
done
.venv/bin/auditwheel show --ldpaths "$work/ld" "$wheel" 2>/dev/null | tee build/auditwheel-show.txt
# The wheel as a whole must fit a manylinux policy: no library outside it, symbol versions within it.
.venv/bin/auditwheel show --json --ldpaths "$work/ld" "$wheel" 2>/dev/null > "$work/auditwheel.json"
.venv/bin/python - "$work/auditwheel.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
tag, libs = report["overall_tag"], sorted(report["external_libs"])
print(f"check_wheel: auditwheel: {tag}; libraries outside every policy: {libs or 'none'}")
if not tag.startswith("manylinux_") or libs:
    sys.exit(f"check_wheel: auditwheel: {tag}, and outside the policy: {libs}")
PY

status=0
unpacked=$work/wheel
.venv/bin/python -m zipfile -e "$wheel" "$unpacked"
base='^(libc|libm|libpthread|libdl|librt|ld-linux-x86-64|libstdc\+\+|libgcc_s|libz)\.so'
while IFS= read -r -d '' file; do
  readelf -h "$file" > /dev/null 2>&1 || continue
  name=${file#"$unpacked"/}
  needed=$(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  echo "check_wheel: $name: $(du -k "$file" | cut -f1) KiB, needs $needed"
  case "$name" in
    */HPRPlugin.so) continue ;;  # exempt: it loads into Debian's mlir-opt-19
  esac
  for lib in $needed; do
    [[ $lib =~ $base ]] || { echo "check_wheel: $name needs $lib" >&2; status=1; }
  done
done < <(find "$unpacked" -type f -print0)

echo "check_wheel: a fresh venv ($venv) with torch and numpy from requirements.txt, and the wheel"
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  $(grep -E '^(torch|numpy)==' requirements.txt | cut -d' ' -f1) "$wheel"

# In the namespace: the planner on the bundled default, a torch.export and a TorchScript model, the
# passes, the extension, and one step of a planned ZBV run on two processes.
namespace=(unshare -m)  # as root; elsewhere in a user namespace of its own, where it is root
[ "$(id -u)" -eq 0 ] || namespace=(unshare -r -m)
"${namespace[@]}" bash -euxc '
  venv=$1 src=$2
  mount -t tmpfs none /usr/lib/llvm-19
  [ -z "$(ls -A /usr/lib/llvm-19)" ]
  built_with=$(ls -d "$src"/.venv/lib/python3*/site-packages/torch/lib)
  mount -t tmpfs none "$built_with"
  cd "$(mktemp -d)"
  "$venv/bin/hp-recompute-plan" --version
  "$venv/bin/hp-recompute-plan"
  "$venv/bin/hp-recompute-plan" --schedule-gen zbv --ranks 2 --model "$src/examples/gpt/gpt-sdpa.pt2" --summary > /dev/null
  "$venv/bin/hp-recompute-plan" --schedule-gen zbv --ranks 2 --model "$src/examples/gpt/gpt.pt" --summary > /dev/null
  "$venv/bin/hp-recompute-opt" "$src/examples/mlir/zbv-2x2.mlir" \
    --pass-pipeline="builtin.module(hpr-recompute-pipeline)" > /dev/null
  "$venv/bin/python" -c "import hp_recompute as hr; print(hr.make_plan(schedule_gen=\"zbv\", ranks=2, microbatches=4)[\"summary\"][\"recomputes\"], \"recomputes (the extension)\")"
  "$venv/bin/hp-recompute-plan" --model "$src/examples/gpt/gpt.model.json" --schedule-gen zbv --ranks 2 \
    --microbatches 4 --emit json -o plan.json
  "$venv/bin/python" -m hp_recompute.run --plan plan.json --steps 1
' check_wheel "$PWD/$venv" "$PWD" || status=1
[ $status -eq 0 ] && echo "check_wheel: ok" || echo "check_wheel: FAILED" >&2
exit $status
