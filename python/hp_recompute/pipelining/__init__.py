"""hp-recompute with torch.distributed.pipelining: ``PlannedSchedule`` runs torch's
``PipelineStage`` objects in a plan's order, with the plan's recompute and clear.

See NOTE [ Executing a plan with torch's stages ] in ``schedule.py`` and
docs/pipelining.md. Needs torch >= 2.4 (``torch.distributed.pipelining``).
"""

from .regions import checkpoint_regions
from .schedule import PlannedSchedule
from .torch_csv import load_torch_csv

__all__ = ["PlannedSchedule", "checkpoint_regions", "load_torch_csv"]
