# Sourced by bench/prefetch/run.sh and bench/run/run.sh with their BUILD_DIR argument: sets
# repo, tool (the planner of BUILD_DIR, default build/), py ($PYTHON or the project's .venv),
# out (a scratch folder removed at exit), and measures the bundled GPT's costs on this
# machine with two processes into $out/gpt.costed.json.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tool="${1:-$repo/build}/bin/hp-recompute-plan"
py="${PYTHON:-$repo/.venv/bin/python}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export PYTHONPATH="$repo/python"
if ! "$py" -m hp_recompute.costs --model-json "$repo/examples/gpt/gpt.model.json" --processes 2 \
  -o "$out/gpt.costed.json" > "$out/costs.log" 2>&1; then
  cat "$out/costs.log" >&2
  echo "bench: measuring the bundled GPT's costs failed (above)" >&2
  exit 1
fi
