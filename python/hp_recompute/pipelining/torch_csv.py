"""Reading ``hp-recompute-plan --emit torch-csv`` output back as a plan.

The CSV is torch's compute+comms schedule (``_PipelineScheduleRuntime._load_csv(...,
format="compute_comms")`` loads it); torch's action set has no recompute and no clear, so
the sidecar ``FILE.hpr.json`` carries them (docs/plan-format.md, "torch CSV"). Why nothing
here knows that format: the planner reads the pair with the reader that sits beside its
writer (``readTorchCsv`` in lib/Target/TorchCsv.cpp, through
``hp_recompute._planner.read_torch_csv``), into plan JSON and a map from each action to
the CSV cell (``FILE:ROW:COL ('3F0')``) or sidecar entry (by JSON path) it came from. The
plan is then admitted as a plan file is (``plan.verify.admit_plan``), and every problem
names the cell or the entry, never the JSON path of a plan the user has not seen.
"""

from __future__ import annotations

import os
from typing import Union

from ..errors import RunError
from ..native import planner_extension
from ..plan.reader import Plan
from ..plan.verify import admit_plan

__all__ = ["load_torch_csv", "sidecar_path"]


def sidecar_path(csv_path: Union[str, "os.PathLike[str]"]) -> str:
    """``plan.csv`` -> ``plan.hpr.json``: the sidecar the planner writes and reads beside ``csv_path``."""
    return planner_extension().torch_csv_sidecar_path(os.fspath(csv_path))


def load_torch_csv(path: Union[str, "os.PathLike[str]"]) -> Plan:
    """Reads the torch CSV ``path`` and its sidecar, admits them and returns the plan (``plan.Plan``).

    Raises ``RunError`` naming the cell or the sidecar entry, for a pair the reader cannot
    turn into a plan and for a plan the admission check refuses.

    Example:
        >>> plan = load_torch_csv("plan.csv")  # beside it: plan.hpr.json
    """
    path = os.fspath(path)
    try:
        read = planner_extension().read_torch_csv(path)
    except ValueError as error:
        raise RunError(f"hp_recompute: {error}") from None
    return admit_plan(read.plan, path, read.locate)
