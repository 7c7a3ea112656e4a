#!/usr/bin/env bash
# Simulated step time of none / jit / lookahead=1 / bubble / auto (+ bubble) for 1F1B,
# interleaved 1F1B, ZB-H1, ZBV and DualPipeV at 4 to 32 ranks, on the bundled GPT's
# costs (FLOP-priced) with two blocks per stage. auto gets the memory of checkpointing
# every block under jit (the largest rank's activation peak) as its per-rank budget.
# One run of the planner per cell.
# Usage: bench/prefetch/simulate.sh [BUILD_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$here/../.."
tool="${1:-$repo/build}/bin/hp-recompute-plan"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
json() { "$tool" "$@" --emit json -o "$out/p.json" && cat "$out/p.json"; }
printf '| schedule | ranks x mb | none us | jit us | lookahead=1 | bubble | auto | auto+bubble | bubble won back: step, recompute time | recomputes auto (all) | peak none / all |\n'
printf '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for sched in 1f1b interleaved-1f1b zb-h1 zbv dualpipev; do
  for ranks in 4 8 16 32; do
    mb=$((2 * ranks))
    stages=$ranks
    case "$sched" in interleaved-1f1b|zbv|dualpipev) stages=$((2 * ranks)) ;; esac
    python3 "$here/make_model.py" "$repo/examples/gpt/gpt.model.json" $((2 * stages)) "$out/m.json"
    gen=(--model "$out/m.json" --schedule-gen "$sched" --ranks "$ranks" --microbatches "$mb")
    json "${gen[@]}" --checkpoint none > "$out/none.json"
    json "${gen[@]}" > "$out/jit.json"
    json "${gen[@]}" --prefetch lookahead=1 > "$out/la.json"
    json "${gen[@]}" --prefetch bubble > "$out/bubble.json"
    budget=$(python3 -c "import json; print(max(json.load(open('$out/jit.json'))['summary']['peak_bytes']))")
    json "${gen[@]}" --checkpoint auto --memory-budget "$budget" > "$out/auto.json"
    json "${gen[@]}" --checkpoint auto --memory-budget "$budget" --prefetch bubble > "$out/autob.json"
    python3 - "$out" "$sched" "$ranks" "$mb" <<'PY'
import json, sys
out, sched, ranks, mb = sys.argv[1:]
s = {k: json.load(open(f"{out}/{k}.json"))["summary"] for k in ("none", "jit", "la", "bubble", "auto", "autob")}
t = {k: v["step_time_us"] for k, v in s.items()}
assert t["bubble"] <= t["jit"] * (1 + 1e-12), (sched, ranks, t)
overhead = t["jit"] - t["none"]
hidden = sum(s["bubble"]["recompute_hidden_us"]) / max(1e-9, sum(s["bubble"]["recompute_hidden_us"]) + sum(s["bubble"]["recompute_exposed_us"]))
saved = (t["jit"] - t["bubble"]) / overhead if overhead > 0 else 0.0
ratio = lambda k: f"{t[k] / t['jit']:.3f}"
print(f"| {sched} | {ranks} x {mb} | {t['none']:.0f} | {t['jit']:.0f} | {ratio('la')} | {ratio('bubble')} | "
      f"{ratio('auto')} | {ratio('autob')} | {saved:.0%} of step, {hidden:.0%} of time | "
      f"{s['auto']['recomputes']} ({s['jit']['recomputes']}) | "
      f"{max(s['none']['peak_bytes']) / max(s['jit']['peak_bytes']):.2f} |")
PY
  done
done
echo "ratios: step time / jit's. bubble won back: the share of jit's step-time overhead (jit - none) and of its recompute time (spent idle instead). bubble <= jit asserted in every cell."
