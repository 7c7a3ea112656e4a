"""Admission of a plan before any rank runs it, by the C++ planner's own verifier.

Why through the planner: a runtime executes whatever file it is given -- edited by hand,
written by another tool, or corrupted -- and a broken plan must be refused on every rank,
naming the action and the rule, instead of hanging in a receive or training on wrong
gradients. The rules live once, in C++ (``hpr-verify-comm`` and ``hpr-verify``, listed
in docs/runner.md, "What a runtime refuses"): the extension ``hp_recompute._planner``
reads the plan back into the planner's IR and runs them, exactly as
``hp-recompute-plan --verify PLAN`` does, so the CLI, the runner and ``PlannedSchedule``
name a broken rule in the same words. Nothing here restates a rule.
"""

from __future__ import annotations

import json
import re
from types import ModuleType
from typing import List

from .reader import Plan, RunError

__all__ = ["plan_problems", "planner_extension", "verify_plan"]

_ACTION_PATH = re.compile(r"/ranks/(\d+)/actions/(\d+)")


def planner_extension() -> ModuleType:
    """The extension module ``hp_recompute._planner``; a clear error where the package was not installed."""
    try:
        from .. import _planner as planner
    except ImportError as error:  # a checkout without a build, or a foreign platform
        raise RunError("hp_recompute: the planner extension hp_recompute._planner is missing "
                       f"({error}); install the package (pip install ., or in a checkout bash "
                       "scripts/setup.sh, which installs it into .venv)") from None
    return planner


def plan_problems(plan: Plan) -> List[str]:
    """Every rule ``plan`` breaks, one line each as ``hp-recompute-plan --verify`` prints it.

    An action of a plan read from a torch CSV is named by the CSV cell it came from as
    well (``Plan.origin``). An empty list admits the plan.
    """
    problems = planner_extension().verify_plan(json.dumps(plan.raw), plan.path)
    origin = plan.origin
    if origin is None:
        return list(problems)

    def cell(match: "re.Match[str]") -> str:
        return f"{match.group(0)} ({origin(int(match.group(1)), int(match.group(2)))})"

    return [_ACTION_PATH.sub(cell, line, count=1) for line in problems]


def verify_plan(plan: Plan) -> None:
    """Refuses ``plan`` (``RunError``) if it breaks the runtime contract, naming every broken rule.

    Example:
        >>> verify_plan(load_plan("plan.json"))  # before any rank runs
    """
    problems = plan_problems(plan)
    if problems:
        raise RunError(f"hp_recompute: plan {plan.path} is refused before any rank runs "
                       f"({len(problems)} problem{'s' if len(problems) > 1 else ''}):\n  " + "\n  ".join(problems))
