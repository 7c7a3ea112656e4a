"""hp-recompute with torch.distributed.pipelining: ``PlannedSchedule`` runs torch's
``PipelineStage`` objects in a plan's order, with the plan's recompute and clear.

See NOTE [ Executing a plan with torch's stages ] in ``schedule.py`` and
docs/pipelining.md. Needs torch >= 2.4 (``torch.distributed.pipelining``).
"""

import torch

try:
    import torch.distributed.pipelining  # noqa: F401
except ImportError as _error:  # torch 1.13 has none
    raise ImportError(f"hp_recompute.pipelining needs torch.distributed.pipelining (torch >= 2.4); this torch is "
                      f"{torch.__version__}") from _error

from .regions import checkpoint_regions  # noqa: E402
from .schedule import PlannedSchedule, admitted_plan  # noqa: E402
from .torch_csv import load_torch_csv  # noqa: E402

__all__ = ["PlannedSchedule", "admitted_plan", "checkpoint_regions", "load_torch_csv"]
