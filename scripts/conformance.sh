#!/usr/bin/env bash
# PyTorch's own checkpoint tests against hp_recompute.checkpoint (docs/conformance.md).
# Usage: scripts/conformance.sh PYTORCH_TEST_DIR [PYTHON]
#   PYTORCH_TEST_DIR: the test/ folder of a PyTorch source tree, best of the installed torch's
#     version (git clone --depth 1 --branch v2.13.0 https://github.com/pytorch/pytorch, or
#     Debian's `apt-get source pytorch`); it needs test_autograd.py, test_utils.py and
#     distributed/fsdp/test_checkpoint_wrapper.py. PYTHON: default the project's .venv.
# Runs the tests about checkpointing twice, as they are (baseline: the installed torch) and with
# the non-reentrant checkpoint patched to ours (test/conformance/hpr_conformance.py), and
# fails if a test that passes on the baseline does not pass patched.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: scripts/conformance.sh PYTORCH_TEST_DIR [PYTHON]" >&2
  exit 2
fi
tests="$(cd "$1" && pwd)"
python="${2:-$repo/.venv/bin/python}"
files=(test_autograd.py test_utils.py distributed/fsdp/test_checkpoint_wrapper.py)
for f in "${files[@]}"; do
  [ -f "$tests/$f" ] || { echo "scripts/conformance.sh: $tests/$f: no such file (give PyTorch's test/ folder)" >&2; exit 1; }
done
"$python" -c "import expecttest" 2>/dev/null || {
  echo "scripts/conformance.sh: torch's test helpers need expecttest: $python -m pip install expecttest" >&2
  exit 1
}
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
run() {
  # A failing test is what the comparison reads, not a reason to stop.
  (cd "$tests" && HPR_CONFORMANCE_PATCH="$1" HPR_CONFORMANCE_SERVED="$out/$2.served.json" \
    OMP_NUM_THREADS=1 PYTORCH_TEST_WITH_SLOW=1 \
    PYTHONPATH="$repo/test/conformance:$repo/python${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 1800 "$python" -m pytest -p hpr_conformance -p no:cacheprovider -q -rN \
    "${files[@]}" --junitxml="$out/$2.xml" | tail -3) || true
}
run 0 baseline
run 1 patched
"$python" - "$out/baseline.xml" "$out/patched.xml" "$out/patched.served.json" <<'PY'
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path):
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        state = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        result[f"{case.get('classname')}::{case.get('name')}"] = state
    return result


baseline, patched = outcomes(sys.argv[1]), outcomes(sys.argv[2])
print(f"{len(baseline)} tests about checkpointing; baseline {dict(Counter(baseline.values()))}, "
      f"patched {dict(Counter(patched.values()))}")
for name in sorted(n for n, s in baseline.items() if s == "failed"):
    print(f"  fails on the installed torch too (not compared): {name}")
lost = sorted(n for n, s in baseline.items() if s == "passed" and patched.get(n) != "passed")
for name in lost:
    print(f"  passes on torch, not on hp_recompute: {name} ({patched.get(name, 'not run')})")
served = json.load(open(sys.argv[3]))["hp_recompute"]
print(f"hp_recompute served {served} non-reentrant checkpoint calls")
if not served:
    print("  the patched run called hp_recompute.checkpoint not once: it tested nothing")
sys.exit(1 if lost or not baseline or not served else 0)
PY
