"""The bench's model as a plain module, for ``python -m hp_recompute.costs --module``.

``build`` returns the PlannedSchedule tests' ``Net`` (test/python/pipelining/pp_worker.py)
at the width and depth bench_fsdp.py passes in ``HPR_BENCH_NET`` ("DIM,LAYERS"), so the
planner's costs are measured on the model the bench trains.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "test" / "python" / "pipelining"))

from pp_worker import Net  # noqa: E402


def build() -> Net:
    dim, layers = (int(v) for v in os.environ.get("HPR_BENCH_NET", "256,8").split(","))
    return Net(dim, layers, 0.0)
