#!/usr/bin/env bash
# Simulated: what the checkpoint policies buy at the memory of checkpointing everything
# (docs/models.md, "Policies"; docs/planning.md). A costed Llama-style model
# (llama.costed.json next to this script: examples/llama/model.py measured by
# `python -m hp_recompute.costs --module` at 64 x 64 tokens, see README.md; --measure measures
# it again here) with its block repeated two per stage. Per schedule and size: none, jit
# (every block full), bubble, auto with two policies (the model without its selective costs:
# none or full per block), auto with three (none, selective, full) and that with bubble; auto's
# per-rank budget is jit's activation peak (torch's checkpoint memory: a 1F1B replay runs inside
# its backward, one block at a time), and the last column gives auto + bubble 1.25, 1.5 and 2
# times that. Recovered = (jit - plan) / (jit - none), the share of jit's step-time overhead over
# no checkpointing that the plan wins back.
# Usage: bench/prefetch/policies.sh [BUILD_DIR] [--measure]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$here/../.."
tool="${1:-$repo/build}/bin/hp-recompute-plan"
model="$here/llama.costed.json"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if [ "${2:-}" = "--measure" ]; then
  model="$out/llama.costed.json"
  "$repo/.venv/bin/python" -m hp_recompute.costs --module "$repo/examples/llama/model.py:build" \
    --input-shape 64x64 --input-dtype int64 --repeats 8 -o "$model" >&2
fi
json() { "$tool" "$@" --emit json -o "$out/p.json" && cat "$out/p.json"; }
printf '| schedule | ranks x mb | none us | jit us | recovered: bubble | auto, 2 policies | auto, 3 | auto, 3 + bubble | auto, 3 + bubble: blocks n/s/f, recomputes (jit) | auto, 3 + bubble at 1.25 / 1.5 / 2 x the budget |\n'
printf '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n'
for sched in 1f1b interleaved-1f1b zb-h1 zbv dualpipev; do
  for ranks in 4 8 16 32; do
    mb=$((2 * ranks))
    stages=$ranks
    case "$sched" in interleaved-1f1b|zbv|dualpipev) stages=$((2 * ranks)) ;; esac
    python3 "$here/make_model.py" "$model" $((2 * stages)) "$out/m.json"
    python3 -c "
import json, sys
m = json.load(open(sys.argv[1]))
for r in m['regions']:
    for k in [k for k in r if k.startswith('selective_')]:
        del r[k]
json.dump(m, open(sys.argv[2], 'w'))" "$out/m.json" "$out/m2.json"
    gen=(--schedule-gen "$sched" --ranks "$ranks" --microbatches "$mb")
    json --model "$out/m.json" "${gen[@]}" --checkpoint none > "$out/none.json"
    json --model "$out/m.json" "${gen[@]}" > "$out/jit.json"
    json --model "$out/m.json" "${gen[@]}" --prefetch bubble > "$out/bubble.json"
    budget=$(python3 -c "import json; print(max(json.load(open('$out/jit.json'))['summary']['peak_bytes']))")
    # Budgets as multiples of the checkpoint-all peak (jit's): the planner resolves them.
    json --model "$out/m2.json" "${gen[@]}" --checkpoint auto --memory-budget 1x > "$out/auto2.json"
    json --model "$out/m.json" "${gen[@]}" --checkpoint auto --memory-budget 1x > "$out/auto3.json"
    json --model "$out/m.json" "${gen[@]}" --checkpoint auto --memory-budget 1x --prefetch bubble \
      > "$out/auto3b.json"
    # The same with more memory than jit's: what a larger budget buys.
    for x in 125 150 200; do
      json --model "$out/m.json" "${gen[@]}" --checkpoint auto --memory-budget "$(printf '%d.%02dx' $((x / 100)) $((x % 100)))" \
        --prefetch bubble > "$out/auto3b_$x.json"
    done
    python3 - "$out" "$sched" "$ranks" "$mb" "$budget" <<'PY'
import json, sys
out, sched, ranks, mb, budget = sys.argv[1:]
more = ("auto3b_125", "auto3b_150", "auto3b_200")
plans = {k: json.load(open(f"{out}/{k}.json")) for k in ("none", "jit", "bubble", "auto2", "auto3", "auto3b") + more}
t = {k: p["summary"]["step_time_us"] for k, p in plans.items()}
for k in ("auto2", "auto3", "auto3b") + more:
    x = int(k.split("_")[1]) if "_" in k else 100
    assert plans[k]["planner"]["memory_budget"] == int(budget) * x // 100, (sched, ranks, k)
    assert max(plans[k]["summary"]["peak_bytes"]) <= int(budget) * x // 100, (sched, ranks, k)
# A third policy never makes auto slower (exhaustive: optimal over more choices; greedy: the
# two-policy sweep runs too).
assert t["auto3"] <= t["auto2"] * (1 + 1e-12), (sched, ranks, t)
overhead = t["jit"] - t["none"]
back = lambda k: f"{(t['jit'] - t[k]) / overhead:.0%}"
policies = [r["checkpoint"] for s in plans["auto3b"]["model"]["stages"] for r in s["regions"] if r["checkpointable"]]
count = "/".join(str(sum(1 for p in policies if p is v or p == v)) for v in (False, "selective", True))
print(f"| {sched} | {ranks} x {mb} | {t['none']:.0f} | {t['jit']:.0f} | {back('bubble')} | {back('auto2')} | "
      f"{back('auto3')} | {back('auto3b')} | {count}, {plans['auto3b']['summary']['recomputes']} "
      f"({plans['jit']['summary']['recomputes']}) | {' / '.join(back(k) for k in more)} |")
PY
  done
done
echo "recovered: (jit - plan) / (jit - none) in simulated step time; asserted: every auto plan within its budget (jit's peak, or the multiple shown), auto with three policies no slower than with two."
