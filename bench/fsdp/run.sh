#!/usr/bin/env bash
# PP 2 x FSDP2 (4 gloo processes): torch's interleaved 1F1B and ZBV with checkpointing against PlannedSchedule's
# plans, per reshard_after_forward setting, side by side in one run (bench_fsdp.py). --model net (default: the
# residual MLP of test/python/pipelining/pp_worker.py, --dim/--layers) or --model decoder (the held-out decoder of
# examples/pipelining/model.py, its own sizes; --batch sequences of 16 tokens per dp rank).
# FSDP2 needs torch >= 2.6, so only the venv's torch runs it. Extra flags go to bench_fsdp.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python bench/fsdp/bench_fsdp.py "$@"
