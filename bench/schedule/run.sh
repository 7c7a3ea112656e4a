#!/usr/bin/env bash
# Times import + validate + lower of a ~10^6-action schedule CSV and reports
# peak RSS. Usage: bench/schedule/run.sh [BUILD_DIR]
# (BUILD_DIR holds bin/hpr-schedule-bench; default: build).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../../build}"
bench="$build/bin/hpr-schedule-bench"
[ -x "$bench" ] || bench="$(find "$build" -name hpr-schedule-bench -type f | head -n1)"
[ -x "$bench" ] || { echo "hpr-schedule-bench not found under $build" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# ZBV, 8 ranks: 8 x 2 stages x 3 actions x m cells + idle cells; m = 20833
# gives ~10^6 cells.
"$bench" generate zbv 8 20833 "$tmp/zbv.csv"
ls -l "$tmp/zbv.csv" | awk '{print "csv bytes " $5}'
if [ -x /usr/bin/time ]; then
  /usr/bin/time -v "$bench" run "$tmp/zbv.csv" 2>"$tmp/time.txt"
  grep -E "Maximum resident set size|Elapsed \(wall clock\)" "$tmp/time.txt"
else
  "$bench" run "$tmp/zbv.csv"
  echo "(install GNU time for peak RSS: apt-get install time)"
fi
