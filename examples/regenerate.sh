#!/usr/bin/env bash
# Regenerates the bundled example models with the exporter (python3 -m
# hp_recompute.export). Run from anywhere; needs /usr/bin/python3 with torch.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="${PYTHON:-/usr/bin/python3}"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
cd "$root"

# GPT-style decoder: token ids [4, 40] -> loss. gpt.model.json is the JSON
# graph the CLI embeds as its default model; gpt.ir is the IR text form.
"$py" -m hp_recompute.export --module examples/gpt/model.py:build \
  --input-shape 4x40 --input-dtype int64 -o examples/gpt/gpt.pt \
  --ir examples/gpt/gpt.ir --model-json examples/gpt/gpt.model.json --name gpt

# Deep residual MLP: features [8, 32] -> logits.
"$py" -m hp_recompute.export --module examples/mlp/model.py:build \
  --input-shape 8x32 -o examples/mlp/mlp.pt \
  --ir examples/mlp/mlp.ir --model-json examples/mlp/mlp.model.json --name mlp

# torchtitan-style decoder for the torch.distributed.pipelining example
# (examples/pipelining/train.py): only its model JSON is kept.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" -m hp_recompute.export --module examples/pipelining/model.py:build \
  --input-shape 8x16 --input-dtype int64 -o "$tmp/decoder.pt" \
  --model-json examples/pipelining/decoder.model.json --name decoder

# Small residual CNN: images [4, 3, 16, 16] -> logits.
"$py" -m hp_recompute.export --module examples/cnn/model.py:build \
  --input-shape 4x3x16x16 -o examples/cnn/cnn.pt \
  --ir examples/cnn/cnn.ir --model-json examples/cnn/cnn.model.json --name cnn

# The GPT with SDPA attention as a torch.export program (torch 2.x: the venv's
# python): the planner reads gpt-sdpa.pt2 with no sidecar and no LibTorch.
py2="${PYTHON2:-$root/.venv/bin/python}"
"$py2" -m hp_recompute.export --module examples/gpt/model.py:build_sdpa \
  --input-shape 4x40 --input-dtype int64 -o "$tmp/gpt-sdpa.pt2" --name gpt-sdpa
cp "$tmp/gpt-sdpa.pt2" examples/gpt/gpt-sdpa.pt2
