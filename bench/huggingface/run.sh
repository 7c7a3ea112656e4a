#!/usr/bin/env bash
# A transformers Llama (examples/huggingface) on 2 gloo ranks: PlannedSchedule's ZBV plan against torch's
# interleaved 1F1B and ZBV with checkpointing, side by side in one run (bench_hf.py; README.md holds the table).
# Needs transformers (requirements.txt) and torch >= 2.6, so only the venv's torch runs it. Extra flags go to
# bench_hf.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python bench/huggingface/bench_hf.py "$@"
