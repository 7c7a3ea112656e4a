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
import os
import re
from typing import Any, Dict, List, Optional, Union

from ..errors import RunError
from ..native import planner_extension
from .reader import Locate, Plan, build_plan, read_text

__all__ = ["admit_plan", "load_plan", "plan_problems"]

_LEADING_PATH = re.compile(r"(/[^: ]*): ")


def plan_problems(text: str, path: str, locate: Optional[Locate] = None) -> List[str]:
    """Every rule the plan JSON ``text`` (named ``path``) breaks, one line each, as
    ``hp-recompute-plan --verify`` prints them; an empty list admits the plan.

    ``locate`` maps a JSON path of a plan built from other files (a torch CSV and its
    sidecar) to where the user finds it; each line's leading ``path: /json/path`` is
    replaced by it (a CSV cell, a sidecar entry).
    """
    problems = planner_extension().verify_plan(text, path)
    if locate is None:
        return list(problems)
    prefix = f"{path}: "
    out = []
    for line in problems:
        match = _LEADING_PATH.match(line, len(prefix)) if line.startswith(prefix) else None
        out.append(line if match is None else f"{locate(match.group(1))}: {line[match.end():]}")
    return out


def admit_plan(plan: Union[str, Dict[str, Any]], path: str, locate: Optional[Locate] = None) -> Plan:
    """Admits ``plan`` (plan JSON text, or a plan as a dict) and returns the runtime's view of it.

    Raises ``RunError`` naming every broken rule, before any rank runs, if the plan breaks
    the runtime contract.

    Example:
        >>> plan = admit_plan(plan_dict, "<plan dict>")
    """
    text = plan if isinstance(plan, str) else json.dumps(plan)
    problems = plan_problems(text, path, locate)
    if problems:
        raise RunError(f"hp_recompute: plan {path} is refused before any rank runs "
                       f"({len(problems)} problem{'s' if len(problems) > 1 else ''}):\n  " + "\n  ".join(problems))
    return build_plan(json.loads(text) if isinstance(plan, str) else plan, path)


def load_plan(path: Union[str, "os.PathLike[str]"]) -> Plan:
    """Reads, admits and returns the plan file ``path`` (the C++ reader locates bad bytes and members)."""
    path = os.fspath(path)
    return admit_plan(read_text(path, "plan"), path)
