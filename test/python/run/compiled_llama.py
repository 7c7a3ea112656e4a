"""``--model`` factory for the runner test on compiled blocks: examples/llama/model.py's
``pipeline()`` with each block compiled in place by hp_recompute's split backend (aot_eager)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hp_recompute import compile_backend

_SPEC = importlib.util.spec_from_file_location("hpr_llama_example",
                                               Path(__file__).resolve().parents[3] / "examples" / "llama" / "model.py")
_LLAMA = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = _LLAMA  # its dataclass looks its module up
_SPEC.loader.exec_module(_LLAMA)


def pipeline():
    model = _LLAMA.pipeline()
    for block in model.module.layers.values():
        block.compile(backend=compile_backend("aot_eager"), fullgraph=True)
    return model
