"""The runner's training step, written once: some ranks of a plan, one step, and what it measured.

A single-process run drives every rank here over in-memory transfers; a spawned or torchrun
rank drives its own over gloo. Both run ``StepDriver.run``: the same gradient reset, the
same interpreters (``plan.interpreter.run_step``, which also scales the gradients at
``reduce_grad``), the same counters. What differs stays with the caller: how the step is
timed against other processes (``barrier``), how its memory is measured (``meter``), and
how its gradients are compared with the reference step.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence

import torch

from ..plan.interpreter import PlanInterpreter, run_step
from ..plan.reader import Plan
from ..replay_state import synchronize
from ..sessions import SessionScope, reset_stats, stats
from .executor import RankExecutor, Transport
from .model import PipelineModel, StageSpec
from .reference import buffer_snapshot, updated_buffers

__all__ = ["StepDriver", "COUNTERS"]

#: The session counters a step reports (``sessions.stats``).
COUNTERS = ("session_replays", "plain_replays", "prefetches", "clears")


class StepDriver:
    """Runs ``ranks`` of ``plan`` in this process, one step at a time, on ``model``'s parameters.

    Args:
        plan: the plan (admitted).
        model: the model whose parameters the stages use.
        specs: every stage's spec (``model.split_stages``).
        transport: how boundary tensors travel between ranks.
        ranks: the ranks this process runs.
        mode: ``plan``, ``native`` or ``none`` (``executor.MODES``).
        scopes: rank -> its recompute sessions, where the caller owns them (a rank's watchdog
            clears them on an abort); by default each rank gets its own.
    """

    def __init__(self, plan: Plan, model: PipelineModel, specs: Sequence[StageSpec], transport: Transport,
                 ranks: Sequence[int], mode: str, scopes: Optional[Dict[int, SessionScope]] = None) -> None:
        self.plan, self.model = plan, model
        self.executors = [RankExecutor(r, plan, specs, model, transport, mode, (scopes or {}).get(r)) for r in ranks]
        self.interpreters = [PlanInterpreter("hp_recompute.run", plan, ex.rank, ex, ex.sessions,
                                             sessions=mode == "plan", grad_scale=plan.num_microbatches)
                             for ex in self.executors]
        #: the parameters these ranks' stages train, by name
        self.param_names: List[str] = [n for ex in self.executors for n in ex.param_names]

    def run(self, batches: List[Any], seeds: List[int], meter: Optional[ContextManager[Any]] = None,
            barrier: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
        """One step on ``batches`` (``reference.make_batches``) with their ``seeds``.

        Returns the step's record: ``grads`` (name -> this step's gradient), ``losses`` (microbatch
        -> its share of the step loss), ``buffers`` (those the step updated), ``replays``,
        ``saved_nothing``, ``counters``, ``sessions_left`` (sessions the plan left open, cleared),
        ``step_time_s``, ``busy_s`` and ``action_s`` (summed and listed over the ranks), and
        ``peak_bytes`` (``meter.peak``, or None). Raises ``RunError`` with every rank's step
        abandoned."""
        module = self.model.module
        for p in module.parameters():
            p.grad = None
        for ex, run in zip(self.executors, self.interpreters):
            ex.reset(batches, seeds)
            run.reset()
        buffers_before = buffer_snapshot(module)
        reset_stats()
        if barrier is not None:
            barrier()
        device = next(module.parameters()).device
        synchronize(device)
        t0 = time.perf_counter()
        with meter if meter is not None else contextlib.nullcontext():
            left = run_step(self.interpreters)
        synchronize(device)
        elapsed = time.perf_counter() - t0
        st = stats()
        grads: Dict[str, torch.Tensor] = {}
        for name in self.param_names:
            grad = module.get_parameter(name).grad
            if grad is not None:
                grads[name] = grad
        losses: Dict[int, torch.Tensor] = {}
        for ex in self.executors:
            losses.update(ex.losses)
        return {
            "grads": grads, "losses": losses, "buffers": updated_buffers(module, buffers_before),
            "replays": st["replays"] + sum(ex.native_calls - ex.native_forwards for ex in self.executors),
            "saved_nothing": sum(run.saved_nothing for run in self.interpreters),
            "counters": {k: st[k] for k in COUNTERS}, "sessions_left": len(left), "step_time_s": elapsed,
            "busy_s": sum(run.busy_s for run in self.interpreters),
            "action_s": [t for run in self.interpreters for t in run.action_s],
            "peak_bytes": getattr(meter, "peak", None),
        }
