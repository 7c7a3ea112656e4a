#!/usr/bin/env bash
# Real 2-process runs (gloo, CPU) of the bundled GPT, with its costs measured on this machine,
# planned per schedule family within a budget of B x MULTIPLE, B = 1F1B's checkpoint-all peak
# (--checkpoint auto --prefetch bubble: the planner bounds dw deferral, chooses what to
# checkpoint and places replays within it), and with --schedule-gen auto: per rank the peak
# measured at the allocator against the plan's, gradients against a plain step. Several
# multiples ("1 1.5 2 3") share one cost measurement: a table each, then the step-vs-budget
# frontier (each family's simulated and measured step per multiple).
# Usage: [PYTHON=.venv/bin/python] bench/prefetch/budget_runs.sh [BUILD_DIR] [MULTIPLES] [STEPS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
multiples="${2:-1.5}"
steps="${3:-4}"
for multiple in $multiples; do
  [[ "$multiple" =~ ^[0-9]+(\.[0-9]+)?$ && ! "$multiple" =~ ^0+(\.0+)?$ ]] ||
    { echo "budget_runs.sh: MULTIPLES: expected positive numbers such as \"1 1.5 2 3\", got '$multiple'" >&2; exit 2; }
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "budget_runs.sh: STEPS: expected a positive integer, got '$steps'" >&2; exit 2; }
# shellcheck source=bench/measured_gpt.sh
source "$here/../measured_gpt.sh" "${1:-}"
sizes=(--ranks 2 --microbatches 4)
"$tool" --model "$out/gpt.costed.json" --schedule-gen 1f1b "${sizes[@]}" --checkpoint all --emit json \
  -o "$out/reference.json"
families=(1f1b interleaved-1f1b zb-h1 interleaved-zb zbv dualpipev auto)
for multiple in $multiples; do
  budget=$("$py" -c "import json, sys; print(int(float(sys.argv[2]) * max(json.load(open(sys.argv[1]))['summary']['peak_bytes'])))" \
    "$out/reference.json" "$multiple")
  mkdir -p "$out/$multiple"
  for family in "${families[@]}"; do
    # A family with no plan within the budget is a row that says so, not a failed bench.
    if "$tool" --model "$out/gpt.costed.json" --schedule-gen "$family" "${sizes[@]}" --checkpoint auto \
      --prefetch bubble --memory-budget "$budget" --emit json -o "$out/$multiple/$family.json" 2>"$out/$multiple/$family.err"; then
      "$py" -m hp_recompute.run --plan "$out/$multiple/$family.json" --steps "$steps" \
        --report "$out/$multiple/$family-run.json" --quiet
    fi
  done
  echo "$budget" > "$out/$multiple/budget"
done
"$py" - "$out" "$multiples" "${families[@]}" <<'PY'
import json, os, sys
out, multiples, *families = sys.argv[1:]
multiples = multiples.split()
frontier = {}
for multiple in multiples:
    folder = f"{out}/{multiple}"
    budget = open(f"{folder}/budget").read().strip()
    print(f"\n2 ranks x 4 microbatches, bundled GPT (costs measured here), budget {budget} bytes of activations "
          f"= {multiple} x 1F1B's checkpoint-all peak; --checkpoint auto --prefetch bubble")
    print("| schedule | plan | simulated step ms | step ms | planned activations (max) | peak bytes rank 0, 1 (allocator) "
          "| planned peak | measured / planned | grads, buffers |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |")
    for family in families:
        if not os.path.exists(f"{folder}/{family}-run.json"):
            refusal = open(f"{folder}/{family}.err").read().strip().splitlines()
            print(f"| {family} | no plan: {refusal[0] if refusal else '?'} | | | | | | | |")
            continue
        plan = json.load(open(f"{folder}/{family}.json"))
        run = json.load(open(f"{folder}/{family}-run.json"))
        ranks = sorted(run["ranks"], key=lambda r: r["rank"])
        fused = sum(a["op"] == "backward" for r in plan["ranks"] for a in r["actions"])
        split = sum(a["op"] == "backward_weight" for r in plan["ranks"] for a in r["actions"])
        simulated, measured = plan["summary"]["step_time_us"] / 1000, run["median_step_time_s"] * 1000
        frontier[family, multiple] = (simulated, measured)
        print(f"| {family} | {plan['schedule']['name']}, {split} dw, {fused} B | {simulated:.1f} | {measured:.1f} | "
              f"{max(plan['summary']['peak_bytes'])} | {', '.join(str(r['measured_peak_bytes']) for r in ranks)} | "
              f"{', '.join(str(r['planned_peak_bytes']) for r in ranks)} | "
              f"{', '.join(format(r['measured_over_planned'], '.2f') for r in ranks)} | "
              f"{str(run['grads_match']).lower()}, {str(run['buffers_match']).lower()} |")
if len(multiples) > 1:
    print("\nStep-vs-budget frontier: simulated / measured step ms per multiple of 1F1B's checkpoint-all peak "
          "(- : no plan within it)")
    print("| schedule | " + " | ".join(f"{m} B" for m in multiples) + " |")
    print("| --- | " + " | ".join("---:" for _ in multiples) + " |")
    for family in families:
        cells = [f"{frontier[family, m][0]:.1f} / {frontier[family, m][1]:.1f}" if (family, m) in frontier else "-"
                 for m in multiples]
        print(f"| {family} | " + " | ".join(cells) + " |")
print(f"torch {__import__('torch').__version__}")
PY
