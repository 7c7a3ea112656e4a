#!/usr/bin/env bash
# Eager against compiled blocks under PlannedSchedule (ZBV, 2 gloo ranks), with torch's compiled
# 1F1B + checkpoint as the reference point, side by side in one run (bench_compile.py).
# torch >= 2.13 only (the compiled dx/dw split). Extra flags go to bench_compile.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python bench/compile/bench_compile.py "$@"
