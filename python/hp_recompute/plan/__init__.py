"""Plans as runtimes read them: ``verify`` admits a plan through the C++ planner's reader and
verifier before any rank runs, ``reader`` builds the runtime's view of an admitted plan."""

from ..errors import RunError
from .reader import Action, Plan
from .verify import admit_plan, load_plan, plan_problems

__all__ = ["Action", "Plan", "RunError", "admit_plan", "load_plan", "plan_problems"]
