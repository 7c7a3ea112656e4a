#!/usr/bin/env bash
# Runs every libFuzzer target of a -DHPR_FUZZ=ON build (default build-asan/) for a
# bounded time each (HPR_FUZZ_SECONDS, default 20), from its seed corpus in
# fuzz/corpus/ (copied: the repository's corpus is not changed) with its
# dictionary, fixed seed, as many targets at once as there are cores. Prints one
# summary line per target; fails on any crash, sanitizer report, leak or timeout (the
# reproducer is kept in build-asan/fuzz-findings/ and its path printed).
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-asan}"
seconds="${HPR_FUZZ_SECONDS:-20}"
findings="$build/fuzz-findings"
mkdir -p "$findings"
export LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# One target: its summary line in $findings/$target.result, its exit status in $findings/$target.status.
run_target() {
  local target="$1" dict="$2" extra="$3"
  local bin="$build/bin/hpr-fuzz-$target" work
  work="$(mktemp -d)"
  mkdir "$work.tmp"  # the temporary folder of the target (an importer that reads files only gets one there)
  local args=(-seed=1 -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1
              -artifact_prefix="$findings/$target-")
  [ -n "$dict" ] && args+=(-dict="fuzz/dict/$dict.dict")
  [ -n "$extra" ] && args+=("$extra")
  TMPDIR="$work.tmp" "$bin" "${args[@]}" "$work" "fuzz/corpus/$target" >"$work.log" 2>&1
  local code=$?
  # The last report is the target's own (forked importers of a .pt may print theirs).
  local execs rate
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work.log" | tail -1)
  if [ $code -eq 0 ]; then
    echo "fuzz: hpr-fuzz-$target: ${execs:-?} inputs in ${seconds} s (${rate:-?}/s), corpus $(ls "$work" | wc -l) new, no crash"
  else
    echo "fuzz: hpr-fuzz-$target: FAILED (exit $code); reproducer in $findings:"
    grep -E "ERROR|SUMMARY|artifact|Test unit written" "$work.log" | head -10
  fi >"$findings/$target.result"
  echo "$code" >"$findings/$target.status"
  rm -rf "$work" "$work.tmp" "$work.log"
}

# target:dictionary:extra libFuzzer flags; as many targets at once as there are cores
# (each target is one process), so the leg takes its targets' time over the cores.
specs=(schedule-csv:schedule-csv: schedule-json:json: model-json:json:
       mlir:mlir: torchscript-ir:: torchscript-pt:: pt2-program:json: pt2:: plan-json:json:)
jobs="${HPR_JOBS:-$(nproc)}"
targets=()
for spec in "${specs[@]}"; do
  IFS=: read -r target dict extra <<<"$spec"
  targets+=("$target")
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run_target "$target" "$dict" "$extra" &
done
wait
status=0
for target in "${targets[@]}"; do
  cat "$findings/$target.result"
  [ "$(cat "$findings/$target.status")" = 0 ] || status=1
  rm -f "$findings/$target.result" "$findings/$target.status"
done
exit $status
