"""``--model`` factory for the runner test on compiled blocks: examples/llama/model.py's
``pipeline()`` with each block compiled in place by hp_recompute's split backend (aot_eager)."""

from __future__ import annotations

from pathlib import Path

from hp_recompute import compile_backend
from hp_recompute.factory import call_factory

LLAMA = Path(__file__).resolve().parents[3] / "examples" / "llama" / "model.py"


def pipeline():
    model = call_factory(f"{LLAMA}:pipeline", "compiled_llama", RuntimeError)
    for block in model.module.layers.values():
        block.compile(backend=compile_backend("aot_eager"), fullgraph=True)
    return model
