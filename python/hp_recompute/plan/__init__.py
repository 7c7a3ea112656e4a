"""Plans as runtimes read them: ``reader`` parses plan JSON (docs/plan-format.md) with located
errors, ``check`` refuses a plan that breaks the runtime contract before any rank runs."""

from .check import validate_plan
from .reader import Action, Plan, RunError, load_plan, parse_plan

__all__ = ["Action", "Plan", "RunError", "load_plan", "parse_plan", "validate_plan"]
