#!/usr/bin/env bash
# Planned peaks against the allocator for models costed with no adapter
# (`python -m hp_recompute.costs --module`, issue 27 deliverable 1): per model, costs
# measured on the plain nn.Module, a plan per schedule and checkpointing (2 ranks, even
# 2-stage split), one real 2-process run (gloo, CPU) of the runner, whose step 0 measures
# each rank's peak at the allocator (torch.profiler memory events). The runner itself
# needs region functions, so it runs each model's PipelineModel (the bundled adapters,
# examples/llama/model.py:pipeline); the costs never see them.
# Usage: [PYTHON=.venv/bin/python] bench/costs/run.sh [BUILD_DIR] [MICROBATCHES] [STEPS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${1:-$repo/build}"
mb="${2:-4}"
steps="${3:-2}"
tool="$build/bin/hp-recompute-plan"
py="${PYTHON:-$repo/.venv/bin/python}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export PYTHONPATH="$repo/python"
ex="$repo/examples"
# name | --module | input flags | runner --model | even split in 2 stages | in 4 (ZBV: 2 per rank)
models=(
  "gpt|$ex/gpt/model.py:build|--input-shape 4x40 --input-dtype int64|$ex/gpt/model.py:pipeline|0:0-4,1:5-9|0:0-2,1:3-4,2:5-6,3:7-9"
  "mlp|$ex/mlp/model.py:build|--input-shape 8x32|$ex/mlp/model.py:pipeline|0:0-8,1:9-17|0:0-4,1:5-8,2:9-12,3:13-17"
  "llama|$ex/llama/model.py:build|--input-shape 2x64 --input-dtype int64|$ex/llama/model.py:pipeline|0:0-2,1:3-5|0:0-1,1:2-2,2:3-3,3:4-5"
)
has_sdpa=$("$py" -c 'import torch.nn.functional as F; print(int(hasattr(F, "scaled_dot_product_attention")))')
rows="$out/rows.txt"
: > "$rows"
for m in "${models[@]}"; do
  IFS='|' read -r name module inputs factory two four <<<"$m"
  if [ "$name" = llama ] && [ "$has_sdpa" = 0 ]; then
    echo "$name|skipped: needs F.scaled_dot_product_attention (torch >= 2.0)" >> "$rows"
    continue
  fi
  # shellcheck disable=SC2086
  "$py" -m hp_recompute.costs --module "$module" $inputs -o "$out/$name.costed.json" >/dev/null 2>&1
  for sched in 1f1b zb-h1 zbv; do
    stages="$two"
    [ "$sched" = zbv ] && stages="$four"
    for ckpt in all model; do
      plan="$out/$name-$sched-$ckpt.json"
      "$tool" --model "$out/$name.costed.json" --checkpoint "$ckpt" --stages "$stages" --schedule-gen "$sched" \
        --ranks 2 --microbatches "$mb" --emit json -o "$plan"
      "$py" -m hp_recompute.run --plan "$plan" --model "$factory" --steps "$steps" --report "$plan.run.json" --quiet
      echo "$name|$sched|$ckpt|$plan.run.json" >> "$rows"
    done
  done
done
"$py" - "$rows" "$mb" "$steps" <<'PY'
import json, platform, sys, datetime, torch
rows, mb, steps = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"2 ranks x {mb} microbatches, even split (2 stages; ZBV 4), {steps} steps (step 0 measured at the allocator); "
      f"costs: python -m hp_recompute.costs --module (no adapter)")
print("| model | schedule | checkpoint | peak bytes rank 0, 1 (allocator) | planned peak | measured / planned | grads |")
print("| --- | --- | --- | --- | --- | --- | --- |")
worst = {}
for line in open(rows):
    parts = line.rstrip("\n").split("|")
    if len(parts) == 2:
        print(f"| {parts[0]} | {parts[1]} | | | | | |")
        continue
    name, sched, ckpt, path = parts
    r = json.load(open(path))
    ratios = [x["measured_over_planned"] for x in r["ranks"]]
    worst[name] = max(worst.get(name, 0), *(abs(x - 1) for x in ratios))
    print(f"| {name} | {sched} | {'all' if ckpt == 'all' else 'none'} | "
          f"{', '.join(str(x['measured_peak_bytes']) for x in r['ranks'])} | "
          f"{', '.join(str(x['planned_peak_bytes']) for x in r['ranks'])} | "
          f"{', '.join(f'{x:.3f}' for x in ratios)} | {str(r['grads_match']).lower()} |")
print()
print("worst |measured / planned - 1| per model: " + ", ".join(f"{k} {v:.3f}" for k, v in worst.items()))
print(f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, "
      f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
PY
