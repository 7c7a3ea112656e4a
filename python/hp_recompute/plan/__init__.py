"""Plans as runtimes read them: ``reader`` parses plan JSON (docs/plan-format.md) with located
errors, ``verify`` admits a plan through the C++ planner's verifier before any rank runs."""

from .reader import Action, Plan, RunError, load_plan, parse_plan
from .verify import plan_problems, verify_plan

__all__ = ["Action", "Plan", "RunError", "load_plan", "parse_plan", "plan_problems", "verify_plan"]
