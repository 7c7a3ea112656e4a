#!/usr/bin/env bash
# Real 2-process runs (gloo, CPU) of the bundled GPT with costs measured on this machine:
# no checkpointing, torch.utils.checkpoint per backward call (native), and the planned
# sessions with jit, bubble and auto + bubble placement (auto's budget: the activation
# peak of checkpointing every block), side by side, repeated to show the noise. Each run
# takes the median of steps 1..STEPS-1 (step 0 also measures memory).
# Usage: [PYTHON=.venv/bin/python] [SCHEDULES="1f1b zbv dualpipev"] [VARIANTS="none native jit bubble auto"]
#        bench/prefetch/run.sh [BUILD_DIR] [MICROBATCHES] [STEPS] [REPEATS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mb="${2:-4}"
steps="${3:-6}"
repeats="${4:-3}"
# shellcheck source=bench/measured_gpt.sh
source "$here/../measured_gpt.sh" "${1:-}"
read -r -a schedules <<< "${SCHEDULES:-1f1b zbv dualpipev}"
read -r -a names <<< "${VARIANTS:-none native jit bubble auto}"
for sched in "${schedules[@]}"; do
  gen=(--model "$out/gpt.costed.json" --schedule-gen "$sched" --ranks 2 --microbatches "$mb" --emit json)
  "$tool" "${gen[@]}" --checkpoint none -o "$out/$sched-none.json"
  "$tool" "${gen[@]}" -o "$out/$sched-jit.json"
  "$tool" "${gen[@]}" --prefetch bubble -o "$out/$sched-bubble.json"
  budget=$("$py" -c "import json; print(max(json.load(open('$out/$sched-jit.json'))['summary']['peak_bytes']))")
  "$tool" "${gen[@]}" --checkpoint auto --memory-budget "$budget" --prefetch bubble -o "$out/$sched-auto.json"
done
# variant -> plan file, checkpoint mode
declare -A plan_of=([none]=none [native]=jit [jit]=jit [bubble]=bubble [auto]=auto)
declare -A mode_of=([none]=none [native]=native [jit]=plan [bubble]=plan [auto]=plan)
for rep in $(seq 1 "$repeats"); do
  for sched in "${schedules[@]}"; do
    for name in "${names[@]}"; do
      plan=${plan_of[$name]} mode=${mode_of[$name]}
      "$py" -m hp_recompute.run --plan "$out/$sched-$plan.json" --steps "$steps" --checkpoint-mode "$mode" \
        --report "$out/$sched-$name-$rep.json" --quiet
    done
  done
done
"$py" - "$out" "$mb" "$steps" "$repeats" "${names[*]}" "${schedules[@]}" <<'PY'
import json, statistics, sys
out, mb, steps, repeats, names, *schedules = sys.argv[1:]
names = names.split()
print(f"2 ranks x {mb} microbatches, bundled GPT with measured costs, median of steps 1..{int(steps) - 1} "
      f"per run, {repeats} runs per cell (in turn)")
print("| schedule | variant | step ms per run | median ms | vs jit | simulated ms | sim vs jit | "
      "recomputes/step | grads, buffers |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
torch_version = None
for sched in schedules:
    runs = {n: [json.load(open(f"{out}/{sched}-{n}-{r}.json")) for r in range(1, int(repeats) + 1)] for n in names}
    med = {n: statistics.median(r["median_step_time_s"] * 1000 for r in rs) for n, rs in runs.items()}
    sim = {n: rs[0]["planned_step_time_us"] / 1000 for n, rs in runs.items()}
    for n in names:
        r0 = runs[n][0]
        torch_version = r0["torch"]
        per_run = ", ".join(f"{r['median_step_time_s'] * 1000:.1f}" for r in runs[n])
        ok = all(r["grads_match"] and r["buffers_match"] for r in runs[n])
        simulated = "n/a" if n == "native" else f"{sim[n]:.2f}"
        sim_ratio = "n/a" if n == "native" else f"{sim[n] / sim['jit']:.3f}"
        print(f"| {sched} | {n} | {per_run} | {med[n]:.1f} | {med[n] / med['jit']:.3f} | {simulated} | "
              f"{sim_ratio} | {r0['recomputes'] // r0['steps']} | {str(ok).lower()} |")
print(f"torch {torch_version}")
PY
