#!/usr/bin/env bash
# torchtitan's production stack (selective checkpoint, inductor, FSDP2 on a dp mesh of one,
# bf16 autocast) under ZBV plans against torch's interleaved 1F1B on the same stack, side by
# side in one run (bench_stack.py). torch >= 2.13 only. Extra flags go to bench_stack.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python bench/compile/bench_stack.py "$@"
