#!/usr/bin/env bash
# The main job: set up and build (scripts/setup.sh: the tools and the extension, not the
# tests), and plan the bundled default (the GPT example on a 4-rank ZBV schedule with 8
# microbatches), printing the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
./build/bin/hp-recompute-plan "$@"
