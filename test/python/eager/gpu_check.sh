#!/usr/bin/env bash
# One-shot GPU check of the eager hp_recompute tests: runs test/python/eager with CUDA
# tensors (HPR_TEST_DEVICE=cuda) on a machine with CUDA and torch 2.x, and writes a log.
# On torch 2.x test_eager_native_vs_session.py shows torch's checkpoint replaying twice
# across dx/dw while a session replays once. Without CUDA it prints a skip line and exits 0.
#
# Usage: test/python/eager/gpu_check.sh [LOG]     (PYTHON=... picks the interpreter)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
py=${PYTHON:-python3}
log=${1:-${OUT:-$root}/hpr_eager_gpu_check.log}

if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  echo "gpu_check: skipped: no CUDA device visible to $py (or torch missing)"
  exit 0
fi

{
  echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  cd "$root" && HPR_TEST_DEVICE=cuda "$py" -m pytest test/python/eager -v -rs -p no:cacheprovider
} 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "gpu_check: exit status $status, log in $log"
exit "$status"
