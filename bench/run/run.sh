#!/usr/bin/env bash
# Real multi-process runs (gloo, CPU, 2 ranks) of the bundled GPT against the planner's
# simulation, per schedule: hp-recompute's plan (sessions), torch.utils.checkpoint in
# each backward call (native) and no checkpointing, side by side in one run.
# The model's costs are measured first with `python -m hp_recompute.costs` on the same
# torch, so the simulated step uses this machine's forward / dx / dw times. Each run's
# own action times (`hp_recompute.costs --from-run`) are then planned again: the second
# simulation has the durations the actions had in that run, under the same contention.
# Usage: [PYTHON=.venv/bin/python] bench/run/run.sh [BUILD_DIR] [MICROBATCHES] [STEPS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mb="${2:-4}"
steps="${3:-6}"
# shellcheck source=bench/measured_gpt.sh
source "$here/../measured_gpt.sh" "${1:-}"
# The --stages spec of the plan a run report executed: replanned, the run's split is kept (a
# split balanced again by the run's times could move a region to another stage).
split_of() {
  "$py" -c "
import json, sys
stages, first, spans = json.load(open(json.load(open(sys.argv[1]))['plan']))['model']['stages'], 0, []
for st in stages:
    spans.append(f\"{st['stage']}:{first}-{first + len(st['regions']) - 1}\")
    first += len(st['regions'])
print(','.join(spans))" "$1"
}
for sched in 1f1b zb-h1 zbv; do
  "$tool" --model "$out/gpt.costed.json" --checkpoint all --schedule-gen "$sched" --ranks 2 \
    --microbatches "$mb" --emit json -o "$out/$sched-all.json"
  "$tool" --model "$out/gpt.costed.json" --checkpoint model --schedule-gen "$sched" --ranks 2 \
    --microbatches "$mb" --emit json -o "$out/$sched-none.json"
  for mode in plan native; do
    "$py" -m hp_recompute.run --plan "$out/$sched-all.json" --steps "$steps" --checkpoint-mode "$mode" \
      --report "$out/$sched-$mode.json" --quiet
  done
  "$py" -m hp_recompute.run --plan "$out/$sched-none.json" --steps "$steps" \
    --report "$out/$sched-none-run.json" --quiet
  for run in plan:all none-run:model; do
    report="$out/$sched-${run%%:*}.json"
    "$py" -m hp_recompute.costs --model-json "$repo/examples/gpt/gpt.model.json" --from-run "$report" \
      -o "$report.costs.json" >/dev/null
    "$tool" --model "$report.costs.json" --checkpoint "${run##*:}" --stages "$(split_of "$report")" \
      --schedule-gen "$sched" --ranks 2 --microbatches "$mb" --emit json -o "$report.replanned.json"
  done
done
"$py" - "$out" "$mb" "$steps" <<'PY'
import json, sys
out, mb, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(f"2 ranks x {mb} microbatches, bundled GPT (8 blocks), {steps} steps; step 0 measures memory "
      f"(profiler), the median of steps 1..{steps - 1} is the step time")
print("| schedule | checkpointing | step ms | simulated ms | measured / simulated | simulated, run's costs ms | "
      "measured / simulated | vs none | block replays/step | peak bytes rank 0, 1 (allocator) | planned peak | "
      "measured / planned | grads, buffers |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- |")
names = {"plan": "hp-recompute plan", "native": "torch.utils.checkpoint", "none": "none"}
torch_version = None
for sched in ("1f1b", "zb-h1", "zbv"):
    rows = {"plan": f"{sched}-plan", "native": f"{sched}-native", "none": f"{sched}-none-run"}
    reports = {m: json.load(open(f"{out}/{name}.json")) for m, name in rows.items()}
    none_s = reports["none"]["median_step_time_s"]
    for mode, r in reports.items():
        torch_version = r["torch"]
        sim = r["planned_step_time_us"] / 1000 if mode != "native" else None
        again = (json.load(open(f"{out}/{rows[mode]}.json.replanned.json"))["summary"]["step_time_us"] / 1000
                 if mode != "native" else None)
        step = r["median_step_time_s"] * 1000
        peaks = ", ".join(str(x["measured_peak_bytes"]) for x in r["ranks"])
        planned = ", ".join(str(x["planned_peak_bytes"]) for x in r["ranks"]) if mode != "native" else "n/a"
        ratio = (", ".join(f"{x['measured_over_planned']:.2f}" for x in r["ranks"])
                 if mode != "native" else "n/a")
        print(f"| {sched} | {names[mode]} | {step:.1f} | {f'{sim:.1f}' if sim else 'n/a'} | "
              f"{f'{step / sim:.2f}' if sim else 'n/a'} | {f'{again:.1f}' if again else 'n/a'} | "
              f"{f'{step / again:.2f}' if again else 'n/a'} | {r['median_step_time_s'] / none_s:.2f} | "
              f"{r['recomputes'] // r['steps']} | {peaks} | {planned} | {ratio} | "
              f"{str(r['grads_match']).lower()}, {str(r['buffers_match']).lower()} |")
print(f"torch {torch_version}")
PY
