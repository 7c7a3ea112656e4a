#!/usr/bin/env bash
# Planning throughput: generated ZBV schedules (8 ranks) of about 10^4, 10^5
# and 10^6 actions, planned end to end (generate -> lower -> validate ->
# import -> passes -> simulate -> export), timed side by side in one run.
# Usage: bench/plan/run.sh [build-dir] [baseline-build-dir]
# With a baseline (another checkout's build), two more tables time both binaries,
# alternating, 3 runs each (median wall seconds, the ratio, the median peak RSS of each):
# on the first table's plans, and on the second table's auto choices for the GPT.
set -euo pipefail
build="${1:-build}"
baseline="${2:-}"
tool="$build/bin/hp-recompute-plan"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
printf '| microbatches | actions | emit | wall s | peak RSS MiB | us/action |\n'
printf '| ---: | ---: | --- | ---: | ---: | ---: |\n'
for mb in 74 740 7400; do
  for emit in summary json; do
    /usr/bin/time -f '%e %M' -o "$out/time" \
      "$tool" --schedule-gen zbv --ranks 8 --microbatches "$mb" --emit "$emit" -o "$out/plan.$emit"
    read -r wall rss < "$out/time"
    actions=$("$tool" --schedule-gen zbv --ranks 8 --microbatches "$mb" | awk '$1 == "total" {print $2}')
    awk -v mb="$mb" -v a="$actions" -v e="$emit" -v w="$wall" -v r="$rss" \
      'BEGIN { printf "| %d | %d | %s | %.2f | %.0f | %.2f |\n", mb, a, e, w, r / 1024, w * 1e6 / a }'
  done
done

# The planning choices by time and memory on a costed model at about 10^5 actions:
# ZBV, 8 ranks, 740 microbatches, a model's block repeated to 16 blocks (two per stage):
# the bundled GPT's (FLOP-priced), and the costed Llama's of bench/prefetch (measured, with
# selective costs: auto chooses among three policies). auto's budget: the activation peak
# of checkpointing every block.
choices() {  # LABEL MODEL_JSON
  python3 "$(dirname "$0")/../prefetch/make_model.py" "$2" 16 "$out/m16.json"
  gen=(--model "$out/m16.json" --schedule-gen zbv --ranks 8 --microbatches 740)
  "$tool" "${gen[@]}" --emit json -o "$out/jit.json"
  budget=$(python3 -c "import json; print(max(json.load(open('$out/jit.json'))['summary']['peak_bytes']))")
  printf '\n| choice (%s x16, ZBV 8 x 740) | actions | wall s | peak RSS MiB |\n' "$1"
  printf '| --- | ---: | ---: | ---: |\n'
  for choice in "--prefetch jit" "--prefetch bubble" "--checkpoint auto --memory-budget $budget" \
                "--checkpoint auto --memory-budget $budget --prefetch bubble"; do
    # shellcheck disable=SC2086
    /usr/bin/time -f '%e %M' -o "$out/time" "$tool" "${gen[@]}" $choice --emit json -o "$out/plan.json"
    read -r wall rss < "$out/time"
    actions=$(python3 -c "import json; print(sum(len(r['actions']) for r in json.load(open('$out/plan.json'))['ranks']))")
    label=${choice/--memory-budget $budget/--memory-budget B}
    awk -v c="$label" -v a="$actions" -v w="$wall" -v r="$rss" \
      'BEGIN { printf "| `%s` | %d | %.2f | %.0f |\n", c, a, w, r / 1024 }'
  done
}
choices GPT examples/gpt/gpt.model.json
choices "Llama (selective costs)" "$(dirname "$0")/../prefetch/llama.costed.json"

# Bubble on 32 ranks, where its critical placement takes the most rounds: the GPT's block x 64
# on ZBV 32 x 800, and the costed Llama's x 128 on interleaved 1F1B 32 x 64 with auto at jit's
# peak (a cell of bench/prefetch/policies.sh).
printf '\n| plan (32 ranks) | wall s, jit | wall s, bubble |\n| --- | ---: | ---: |\n'
many() {  # LABEL MODEL_JSON BLOCKS SCHEDULE MICROBATCHES CHECKPOINT(all|auto)
  python3 "$(dirname "$0")/../prefetch/make_model.py" "$2" "$3" "$out/m.json"
  gen=(--model "$out/m.json" --schedule-gen "$4" --ranks 32 --microbatches "$5")
  /usr/bin/time -f '%e' -o "$out/jit.time" "$tool" "${gen[@]}" --emit json -o "$out/jit.json"
  choice=()
  if [ "$6" = auto ]; then
    budget=$(python3 -c "import json; print(max(json.load(open('$out/jit.json'))['summary']['peak_bytes']))")
    choice=(--checkpoint auto --memory-budget "$budget")
  fi
  /usr/bin/time -f '%e' -o "$out/bubble.time" "$tool" "${gen[@]}" "${choice[@]}" --prefetch bubble \
    --emit json -o "$out/plan.json"
  printf '| %s | %s | %s |\n' "$1" "$(cat "$out/jit.time")" "$(cat "$out/bubble.time")"
}
many "GPT x64, ZBV 32 x 800" examples/gpt/gpt.model.json 64 zbv 800 all
many "Llama x128, interleaved 1F1B 32 x 64, auto" "$(dirname "$0")/../prefetch/llama.costed.json" 128 \
  interleaved-1f1b 64 auto

[ -n "$baseline" ] || exit 0
median() { sort -n | sed -n 2p; }  # of 3
# Both binaries on one command line (the plan to -o in it), alternating, 3 runs each:
# prints the median wall seconds of the baseline and this build, then their median peak RSS.
both() {
  : > "$out/base" && : > "$out/this"
  for _ in 1 2 3; do
    for side in base this; do
      bin="$baseline/bin/hp-recompute-plan"; [ "$side" = this ] && bin="$tool"
      /usr/bin/time -f '%e %M' -a -o "$out/$side" "$bin" "$@"
    done
  done
  echo "$(cut -d' ' -f1 "$out/base" | median) $(cut -d' ' -f1 "$out/this" | median)" \
       "$(cut -d' ' -f2 "$out/base" | median) $(cut -d' ' -f2 "$out/this" | median)"
}
row() {  # LABEL... then "b t br tr" on stdin
  read -r b t br tr
  awk -v l="$1" -v b="$b" -v t="$t" -v br="$br" -v tr="$tr" \
    'BEGIN { printf "| %s | %.2f | %.2f | %.2f | %.0f, %.0f |\n", l, b, t, t / b, br / 1024, tr / 1024 }'
}
printf '\n| microbatches | emit | baseline s | this build s | this / baseline | peak RSS MiB: baseline, this |\n'
printf '| ---: | --- | ---: | ---: | ---: | --- |\n'
for mb in 74 740 7400; do
  for emit in summary json; do
    both --schedule-gen zbv --ranks 8 --microbatches "$mb" --emit "$emit" -o "$out/plan.$emit" | row "$mb | $emit"
  done
done
# The auto choices of the second table (GPT x16, ZBV 8 x 740, budget B from this build's jit plan).
python3 "$(dirname "$0")/../prefetch/make_model.py" examples/gpt/gpt.model.json 16 "$out/m16.json"
gen=(--model "$out/m16.json" --schedule-gen zbv --ranks 8 --microbatches 740)
"$tool" "${gen[@]}" --emit json -o "$out/jit.json"
budget=$(python3 -c "import json; print(max(json.load(open('$out/jit.json'))['summary']['peak_bytes']))")
printf '\n| choice (GPT x16, ZBV 8 x 740) | baseline s | this build s | this / baseline | peak RSS MiB: baseline, this |\n'
printf '| --- | ---: | ---: | ---: | --- |\n'
for bubble in "" "--prefetch bubble"; do
  # shellcheck disable=SC2086
  both "${gen[@]}" --checkpoint auto --memory-budget "$budget" $bubble --emit json -o "$out/plan.json" |
    row "\`--checkpoint auto --memory-budget B${bubble:+ $bubble}\`"
done
