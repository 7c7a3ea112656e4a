"""The C++ planner from Python, in process: ``make_plan`` and ``verify_plan``.

Why in process and not through the CLI: a training script or a notebook plans for the
model and schedule it has at hand, and wants the plan as data and the planner's
diagnostics as an exception, not a subprocess and a temporary file. Both calls run the
C++ code of ``hp-recompute-plan`` through the extension ``hp_recompute._planner``
(``mlir::hpr::runPlanner`` and the admission check ``verifyImportedPlan``): the same
import, passes and verifier, so a plan made here is byte for byte the one the CLI writes
(docs/python-api.md, "The planner from Python").
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Optional, Union

from .errors import RunError
from .native import planner_extension
from .plan.reader import read_text
from .plan.verify import plan_problems

__all__ = ["PlanError", "PlanWarning", "make_plan", "verify_plan"]

PathLike = Union[str, "os.PathLike[str]"]


class PlanError(RunError):
    """The planner refused: ``problems`` holds its diagnostics, one line each, located at a file
    position, a schedule cell (``FILE:ROW:COL``) or a plan action (``FILE: /ranks/R/actions/K``)."""

    def __init__(self, problems: List[str]) -> None:
        super().__init__("hp_recompute: " + "\n".join(problems))
        self.problems = list(problems)


class PlanWarning(UserWarning):
    """What ``hp-recompute-plan`` prints as a ``warning:`` line (a plan made, with a caveat the
    warning names by its rule id, e.g. ``[hpr.split.weight-input-unknown]``)."""


def make_plan(schedule: Optional[PathLike] = None, *, schedule_gen: Optional[str] = None,
              model: Optional[PathLike] = None, ranks: Optional[int] = None, microbatches: Optional[int] = None,
              stages_per_rank: Optional[int] = None, checkpoint: Optional[str] = None,
              prefetch: Optional[str] = None, memory_budget: Union[int, str, None] = None,
              stages: Optional[str] = None, dp_shard: Optional[int] = None, dp_replicate: Optional[int] = None
              ) -> Dict[str, Any]:
    """Plans a schedule for a model, as ``hp-recompute-plan ... --emit json`` does, and returns the plan.

    An argument left None is an option not given: the planner applies the CLI's default, and
    refuses what the CLI refuses (an option the chosen inputs would not read).

    Args:
        schedule: a schedule file (torch pipelining CSV or JSON); or
        schedule_gen: a built-in schedule (gpipe, 1f1b, interleaved-1f1b, zb-h1, interleaved-zb, zbv,
            dualpipev)
            sized by ``ranks`` (4), ``microbatches`` (8) and ``stages_per_rank`` (the schedule's own);
            or ``auto``: each of them but gpipe planned within ``memory_budget`` (a multiple is then
            of 1F1B's checkpoint-all peak), the plan with the shortest simulated step returned; its
            ``planner.schedule_candidates`` lists every one planned (docs/cli.md).
        model: a model file (``.pt2`` or model JSON; TorchScript ``.pt``/``.ir`` need LibTorch
            and are read by the CLI only); None plans the schedule alone (unit-cost stages).
        checkpoint: ``all`` (the default), ``model``, ``none``, ``auto`` (needs ``memory_budget``)
            or ``selective``; needs ``model``.
        prefetch: ``jit`` (the default), ``lookahead=K`` or ``bubble``.
        memory_budget: the per-rank activation budget (what ``auto`` and ``bubble`` fit within, and
            what a zero-bubble schedule's dw deferral is bounded to):
            bytes, as an int or as ``--memory-budget`` spells them (``"24GiB"``), or a multiple of
            the checkpoint-all peak (``"1.5x"``: of the most any rank needs with every
            checkpointable region checkpointed and replayed jit, i.e. torch's checkpoint).
        stages: an explicit stage split such as ``0:0-3,1:4-7`` (region indices), or module
            paths per stage, ``0:tok_embeddings,layers.0;1:layers.1,norm,output``; needs ``model``.
        dp_shard, dp_replicate: the data-parallel layout (``--dp-shard``, ``--dp-replicate``;
            docs/fsdp.md): FSDP2 over ``dp_shard`` ranks, HSDP over ``dp_replicate`` groups of
            them. None keeps the model JSON's ``data_parallel`` (1 without it).

    Returns:
        The plan JSON (docs/plan-format.md) as a dict; runtimes take it as ``plan=``.

    Warns:
        PlanWarning: each warning the CLI prints for the same request.

    Raises:
        PlanError: bad input, a schedule that breaks its rules, or a plan over the budget,
            with the planner's located diagnostics; a request the CLI would refuse with exit 2
            (a wrong type included) as one line starting with ``usage: ``.

    Example:
        >>> plan = hp_recompute.make_plan(schedule_gen="zbv", ranks=2, microbatches=4,
        ...                               model="gpt.model.json", prefetch="bubble")
        >>> plan["summary"]["recomputes"]
    """
    schedule, model = _path("schedule", schedule), _path("model", model)
    if model is not None and model.endswith((".pt", ".ir")):
        raise PlanError([f"usage: {model}: a TorchScript model is read by the CLI only "
                         f"(hp-recompute-plan --model ...), which loads LibTorch in its own process"])
    texts = {name: _text(name, value) for name, value in (
        ("schedule_gen", schedule_gen), ("checkpoint", checkpoint), ("prefetch", prefetch), ("stages", stages))}
    counts = {name: _count(name, value) for name, value in (
        ("ranks", ranks), ("microbatches", microbatches), ("stages_per_rank", stages_per_rank),
        ("dp_shard", dp_shard), ("dp_replicate", dp_replicate))}
    if memory_budget is not None and (isinstance(memory_budget, bool) or
                                      not isinstance(memory_budget, (int, str))):
        raise PlanError([f"usage: memory_budget: expected bytes (an int) or a str such as '24GiB' or '1.5x', "
                         f"got {memory_budget!r}"])
    text, problems, said = planner_extension().plan(
        schedule, texts["schedule_gen"], model, counts["ranks"], counts["microbatches"], counts["stages_per_rank"],
        texts["checkpoint"], texts["prefetch"], None if memory_budget is None else str(memory_budget),
        texts["stages"], counts["dp_shard"], counts["dp_replicate"])
    for warning in said:
        warnings.warn(f"hp_recompute.make_plan: {warning}", PlanWarning, stacklevel=2)
    if problems:
        raise PlanError(problems)
    return json.loads(text)


def _path(name: str, value: Optional[PathLike]) -> Optional[str]:
    """``value`` as a file name; PlanError unless None, a non-empty str or an os.PathLike of one."""
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if value is not None and (not isinstance(path, str) or not path):
        raise PlanError([f"usage: {name}: expected a file name (a str or os.PathLike), got {value!r}"])
    return path


def _text(name: str, value: Optional[str]) -> Optional[str]:
    """``value``; PlanError unless None or a non-empty str."""
    if value is not None and (not isinstance(value, str) or not value):
        raise PlanError([f"usage: {name}: expected a non-empty str, got {value!r}"])
    return value


def _count(name: str, value: Optional[int]) -> Optional[int]:
    """``value``; PlanError unless None or an int (not a bool) of at most 64 bits. Its range is
    the planner's to check (``PlanRequest::validate``), as for the CLI."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise PlanError([f"usage: {name}: expected a count (an int), got {value!r}"])
    if value is not None and not -2**63 <= value < 2**63:
        raise PlanError([f"usage: {name}: expected a count (an int), got {value!r}, beyond 64 bits"])
    return value


def verify_plan(plan: Union[PathLike, Dict[str, Any]]) -> None:
    """Runs the admission check every runtime runs before any rank does; raises ``PlanError`` if it fails.

    Args:
        plan: a plan JSON file, or a plan as a dict (``make_plan``'s result, edited or not).

    Example:
        >>> hp_recompute.verify_plan("plan.json")  # as hp-recompute-plan --verify plan.json
    """
    if isinstance(plan, dict):
        problems = plan_problems(json.dumps(plan), "<plan>")
    else:
        path = os.fspath(plan)
        problems = plan_problems(read_text(path, "plan"), path)
    if problems:
        raise PlanError(problems)
