#!/usr/bin/env bash
# Planning throughput: generated ZBV schedules (8 ranks) of about 10^4, 10^5
# and 10^6 actions, planned end to end (generate -> lower -> validate ->
# import -> passes -> simulate -> export), timed side by side in one run.
# Usage: bench/plan/run.sh [build-dir]
set -euo pipefail
build="${1:-build}"
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
