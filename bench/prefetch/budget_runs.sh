#!/usr/bin/env bash
# Real 2-process runs (gloo, CPU) of the bundled GPT, with its costs measured on this machine,
# planned per schedule family within a budget of B x MULTIPLE, B = 1F1B's checkpoint-all peak
# (--checkpoint auto --prefetch bubble: the planner bounds dw deferral, chooses what to
# checkpoint and places replays within it), and with --schedule-gen auto: per rank the peak
# measured at the allocator against the plan's, gradients against a plain step.
# Usage: [PYTHON=.venv/bin/python] bench/prefetch/budget_runs.sh [BUILD_DIR] [MULTIPLE] [STEPS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
multiple="${2:-1.5}"
steps="${3:-4}"
# shellcheck source=bench/measured_gpt.sh
source "$here/../measured_gpt.sh" "${1:-}"
sizes=(--ranks 2 --microbatches 4)
"$tool" --model "$out/gpt.costed.json" --schedule-gen 1f1b "${sizes[@]}" --checkpoint all --emit json \
  -o "$out/reference.json"
budget=$("$py" -c "import json, sys; print(int(float(sys.argv[2]) * max(json.load(open(sys.argv[1]))['summary']['peak_bytes'])))" \
  "$out/reference.json" "$multiple")
families=(1f1b interleaved-1f1b zb-h1 interleaved-zb zbv dualpipev auto)
for family in "${families[@]}"; do
  "$tool" --model "$out/gpt.costed.json" --schedule-gen "$family" "${sizes[@]}" --checkpoint auto \
    --prefetch bubble --memory-budget "$budget" --emit json -o "$out/$family.json"
  "$py" -m hp_recompute.run --plan "$out/$family.json" --steps "$steps" --report "$out/$family-run.json" --quiet
done
"$py" - "$out" "$budget" "$multiple" "${families[@]}" <<'PY'
import json, sys
out, budget, multiple, *families = sys.argv[1:]
print(f"2 ranks x 4 microbatches, bundled GPT (costs measured here), budget {budget} bytes of activations "
      f"= {multiple} x 1F1B's checkpoint-all peak; --checkpoint auto --prefetch bubble")
print("| schedule | plan | simulated step ms | step ms | planned activations (max) | peak bytes rank 0, 1 (allocator) "
      "| planned peak | measured / planned | grads, buffers |")
print("| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |")
for family in families:
    plan = json.load(open(f"{out}/{family}.json"))
    run = json.load(open(f"{out}/{family}-run.json"))
    ranks = sorted(run["ranks"], key=lambda r: r["rank"])
    fused = sum(a["op"] == "backward" for r in plan["ranks"] for a in r["actions"])
    split = sum(a["op"] == "backward_weight" for r in plan["ranks"] for a in r["actions"])
    print(f"| {family} | {plan['schedule']['name']}, {split} dw, {fused} B | "
          f"{plan['summary']['step_time_us'] / 1000:.1f} | {run['median_step_time_s'] * 1000:.1f} | "
          f"{max(plan['summary']['peak_bytes'])} | {', '.join(str(r['measured_peak_bytes']) for r in ranks)} | "
          f"{', '.join(str(r['planned_peak_bytes']) for r in ranks)} | "
          f"{', '.join(format(r['measured_over_planned'], '.2f') for r in ranks)} | "
          f"{str(run['grads_match']).lower()}, {str(run['buffers_match']).lower()} |")
print(f"torch {run['torch']}")
PY
