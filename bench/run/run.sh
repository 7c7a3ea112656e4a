#!/usr/bin/env bash
# Per-step time and recompute count of a real ZBV run (multi-process, gloo, CPU):
# our plan (recompute sessions) vs torch.utils.checkpoint in each backward call
# vs no checkpointing, same model (bundled GPT), same processes, one run.
# Usage: [PYTHON=.venv/bin/python] bench/run/run.sh [BUILD_DIR] [MICROBATCHES] [STEPS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$here/../.."
build="${1:-$repo/build}"
mb="${2:-8}"
steps="${3:-8}"
tool="$build/bin/hp-recompute-plan"
py="${PYTHON:-/usr/bin/python3}"  # PYTHON=.venv/bin/python for torch 2.x
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$tool" --model "$repo/examples/gpt/gpt.model.json" --schedule-gen zbv --ranks 2 \
  --microbatches "$mb" --emit json -o "$out/plan.json"
for mode in plan native none; do
  PYTHONPATH="$repo/python" "$py" -m hp_recompute.run --plan "$out/plan.json" --world-size 2 \
    --steps "$steps" --checkpoint-mode "$mode" --report "$out/report-$mode.json" --quiet
done
"$py" - "$out" "$mb" "$steps" <<'PY'
import json, statistics, sys
out, mb, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = {m: json.load(open(f"{out}/report-{m}.json")) for m in ("plan", "native", "none")}
# Step 0 warms up (allocator, gloo pairs); the median of the rest is reported.
med = {m: statistics.median(r["step_time_s"][1:] or r["step_time_s"]) for m, r in rows.items()}
print(f"ZBV, 2 ranks x {mb} microbatches (4 stages of 2 GPT blocks), {steps} steps, "
      f"median step time of steps 2..{steps}, torch {rows['plan'].get('torch', '?')}")
print("| checkpointing | step ms | vs none | vs native | block replays/step | plan sessions/step | grads_match | peak saved bytes (rank 0, 1) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
names = {"plan": "hp-recompute plan (sessions)", "native": "torch.utils.checkpoint per backward call", "none": "none"}
for m, r in rows.items():
    peaks = ", ".join(str(x["measured_peak_bytes"]) for x in r["ranks"]) if m != "native" else "n/a"
    print(f"| {names[m]} | {med[m] * 1000:.1f} | {med[m] / med['none']:.2f} | {med[m] / med['native']:.2f} | "
          f"{r['recomputes'] // r['steps']} | {r['sessions'] // r['steps']} | {str(r['grads_match']).lower()} | {peaks} |")
plan = rows["plan"]
blocks = plan["recomputes_expected"] // plan["sessions"]
print(f"plan: {plan['plan_recomputes']} session recomputes/step ({blocks} checkpointed blocks each, so "
      f"{plan['plan_recomputes'] * blocks} block replays); checkpointing once per backward call (torch >= 2.1) "
      f"would replay {plan['plan_per_backward_recomputes'] * blocks}; planned peak bytes "
      f"{[x['planned_peak_bytes'] for x in plan['ranks']]}")
PY
