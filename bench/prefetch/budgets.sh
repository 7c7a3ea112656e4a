#!/usr/bin/env bash
# Zero-bubble under a memory budget (issue 51): for each schedule family at 4 ranks x 8
# microbatches, the smallest feasible budget and the simulated step against the fastest
# 1F1B-family plan at 1, 1.5, 2 and 3 x 1F1B's checkpoint-all peak (budgets.py), on three
# 16-block models: the bundled GPT's block with FLOP-priced (GPU-like) times and bytes from
# the exporter; the same times with the bytes measured on this machine (replay_weight_bytes
# among them: what dx leaves for dw); and the costed Llama block of this folder.
# Usage: [PYTHON=.venv/bin/python] bench/prefetch/budgets.sh [BUILD_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=bench/measured_gpt.sh
source "$here/../measured_gpt.sh" "${1:-}"
"$py" - "$out/gpt.costed.json" "$out/gpt-bytes.json" <<'PY'
import json, sys
model = json.load(open(sys.argv[1]))
for region in model["regions"]:  # keep the measured bytes, drop the measured times
    for key in [k for k in region if k.endswith("_time_us")]:
        del region[key]
    region["fwd_time_us"] = 0.0
model["name"] = "gpt-flops-measured-bytes"
json.dump(model, open(sys.argv[2], "w"), indent=1)
PY
python3 "$here/make_model.py" "$repo/examples/gpt/gpt.model.json" 16 "$out/gpt-flops-16.json"
python3 "$here/make_model.py" "$out/gpt-bytes.json" 16 "$out/gpt-flops-measured-bytes-16.json"
python3 "$here/make_model.py" "$here/llama.costed.json" 16 "$out/llama-costed-16.json"
python3 "$here/budgets.py" "$tool" "$out/gpt-flops-16.json" "$out/gpt-flops-measured-bytes-16.json" \
  "$out/llama-costed-16.json"
