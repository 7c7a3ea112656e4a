"""The plan runner: ``python3 -m hp_recompute.run --plan PLAN.json`` (docs/runner.md).

``cli`` is the command line and the report, ``executor`` runs one rank's actions with the
eager session API, ``multiprocess`` spawns the ranks itself, ``torchrun`` runs as one of
torchrun's processes, ``reference`` is the plain step the run is checked against,
``memory`` measures peaks at the allocator, ``model`` brings a model (``PipelineModel``).
"""

from .cli import main, run
from .model import PipelineModel, Region

__all__ = ["PipelineModel", "Region", "main", "run"]
