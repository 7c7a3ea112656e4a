"""``PlannedSchedule``: torch.distributed.pipelining stages driven by an hp-recompute plan.

NOTE [ Executing a plan with torch's stages ]
=============================================
torch's schedules (``ScheduleZBVZeroBubble``, ``ScheduleInterleavedZeroBubble``, ...) own
the action order; their action set has no recompute and no clear, so under
``torch.utils.checkpoint`` every checkpointed block replays once per backward call (twice
with a dx/dw split). ``PlannedSchedule`` takes the order from the plan instead and keeps
everything else torch's: stage objects, metadata inference, microbatch splitting, loss,
point-to-point ops, gradient scaling. The rules below are cited as "Rule N".

Rule 1 (what is checked). At construction, before any communication: the plan's ranks,
  stages and microbatches match the stages given (``group_size``, ``num_stages``,
  ``n_microbatches``, this rank's stage indices), and every region the plan checkpoints
  exists in its stage's module (``regions.checkpoint_regions``). The plan itself is
  checked by ``verify_plan`` (every rank's program, not only ours), so a broken plan is
  refused on every rank before the first step.

Rule 2 (stage mapping). Stages are placed where the plan puts them
  (``stage_index_to_group_rank`` is the plan's ``stage_to_rank``); a neighbour on the same
  rank gets its tensor in memory (torch's V-schedule special case), so the plan has no
  transfer there.

Rule 3 (actions). ``forward``, ``backward_input``, ``backward_weight`` and ``backward``
  are torch's ``forward_one_chunk``, ``backward_one_chunk(full_backward=False)``,
  ``backward_weight_one_chunk`` and ``backward_one_chunk(full_backward=True)``; the
  transfers are torch's ``get_*_send_ops`` / ``get_*_recv_ops`` batched as torch's
  runtime does them, and a receive is waited for by the action that reads it. A forward
  runs inside ``recompute_handle_collector_ctx``, keeping the handles of its checkpoints;
  a forward the plan marks ``"checkpoint": false`` runs its regions plainly.

Rule 3a (message order). torch's point-to-point ops carry no tag: between two ranks,
  receives match sends in the order they are posted (gloo and NCCL alike). A plan
  places each receive where its data is needed, which need not be the order in which
  the peer sends (ZBV: rank 1 needs stage 2's gradient before stage 1's next input, rank
  0 sends that input first). So a ``recv_*`` action posts, in the *peer's send order*
  (read from the peer's program in the plan), every receive from that peer up to and
  including its own; a receive is never posted later than the plan says, only earlier,
  into its own per-microbatch buffer.

Rule 4 (recompute). A schedule owns its sessions: they live in its own ``SessionScope``,
  so two schedules (two models) in one process never share a session, even where their
  plans use the same ids. ``recompute`` replays the handles of that forward into the
  plan's session (``scope.recompute_handle``); each backward action runs inside
  ``scope.recompute_session_ctx(session, retain_on_unpack)`` as the plan says, so dx and
  dw share one replay; ``clear`` is ``scope.clear_recompute_session``. A session that is
  not cleared by the end of the step is an error (the plan promised a clear).

Rule 5 (gradient reduction). A ``reduce_grad`` action of the plan runs torch's
  ``perform_reduce_grad`` (FSDP post-backward, and the gradient scaling of
  ``scale_grads``); a stage whose program has none gets it right after its last ``W`` or
  ``B`` of the step, which is where torch's own lowering (``_add_reduce_grad``) puts it.
  ``verify_plan`` refuses a plan whose ``reduce_grad`` comes before the stage's last
  ``W`` or ``B``, or twice (gradients scaled too early or twice: wrong, silently).

Rule 6 (metadata inference). On the first step torch's stages infer their input and
  output metadata by running microbatch 0 through the stage module (``_initialize_stages``;
  torch 2.13 runs a forward and a backward there, with real tensors). That runs inside
  ``regions.plain_forwards()``: the plan's regions run plainly, so inference creates no
  checkpoint and replays nothing, and every replay of a step is the plan's (one per
  checkpointed region per microbatch).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, _batch_p2p, _wait_batch_p2p
from torch.distributed.pipelining.stage import _PipelineStageBase

from ..checkpoint import recompute_handle_collector_ctx
from ..plan.reader import Action, Plan, RunError, load_plan, parse_plan
from ..plan.verify import verify_plan
from ..sessions import SessionScope
from .regions import checkpoint_regions, plain_forwards
from .torch_csv import load_torch_csv

__all__ = ["PlannedSchedule"]

PlanSource = Union[str, os.PathLike, Dict[str, Any], Plan]


def _read_plan(plan: PlanSource) -> Plan:
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return parse_plan(plan, "<plan dict>")
    path = os.fspath(plan)
    if path.endswith(".csv"):
        return load_torch_csv(path)
    return load_plan(path)


class PlannedSchedule(PipelineScheduleMulti):
    """A torch pipeline schedule whose action order, recomputes and clears come from a plan.

    Use it where torch's schedule class would go (NOTE [ Executing a plan with torch's
    stages ]); ``step`` is torch's.

    Args:
        stages: this rank's ``PipelineStage`` objects (any order).
        n_microbatches: microbatches per step; must equal the plan's.
        loss_fn: as for torch's schedules; ``None`` runs forward only (``eval``).
        plan: a plan JSON path, a parsed plan dict, or a torch CSV written by
            ``hp-recompute-plan --emit torch-csv`` (its ``.hpr.json`` sidecar beside it).
        **kwargs: torch's (``args_chunk_spec``, ``kwargs_chunk_spec``,
            ``output_merge_spec``, ``scale_grads``).

    Example:
        >>> schedule = PlannedSchedule([stage], n_microbatches=8, loss_fn=loss_fn, plan="plan.json")
        >>> losses = []
        >>> schedule.step(x, target=y, losses=losses)  # on the first rank: inputs; on the last: target
    """

    def __init__(self, stages: Sequence[_PipelineStageBase], n_microbatches: int,
                 loss_fn: Optional[Callable[..., torch.Tensor]] = None, *, plan: PlanSource, **kwargs: Any) -> None:
        stages = sorted(stages, key=lambda s: s.stage_index)
        if not stages:
            raise RunError("hp_recompute.pipelining: PlannedSchedule needs this rank's stages; got none")
        super().__init__(list(stages), n_microbatches, loss_fn, **kwargs)
        self.plan = _read_plan(plan)
        verify_plan(self.plan)
        self._check_stages(n_microbatches)
        mapping = {s: r for s, r in enumerate(self.plan.stage_to_rank)}
        self.stage_index_to_group_rank = mapping
        for stage in self._stages:  # Rule 2
            stage.stage_index_to_group_rank = mapping
            checkpoint_regions(stage.submod, self.checkpointed_regions(stage.stage_index), stage.stage_index)
        self.program: List[Action] = self.plan.ranks[self.rank]
        self._reduces = {a.stage for a in self.program if a.op == "reduce_grad"}
        self._send_order = self._sends_to_me()
        self.session_scope = SessionScope(f"PlannedSchedule {self.plan.path} rank {self.rank}")  # Rule 4

    def _sends_to_me(self) -> Dict[int, List[Tuple[str, int, int]]]:
        """Rule 3a: per peer, the (kind, receiving stage, mb) it sends this rank, in its program's order."""
        order: Dict[int, List[Tuple[str, int, int]]] = {}
        for peer, actions in enumerate(self.plan.ranks):
            mine = [(a.op[-1], a.stage + (1 if a.op == "send_f" else -1), a.microbatch) for a in actions
                    if a.op in ("send_f", "send_b") and a.peer == self.rank]
            if mine:
                order[peer] = mine
        return order

    def checkpointed_regions(self, stage: int) -> List[str]:
        """FQNs of the regions the plan checkpoints in ``stage``."""
        return [r["name"] for r in self.plan.stages[stage] if r.get("checkpoint", False)]

    def _check_stages(self, n_microbatches: int) -> None:
        """Rule 1: the stages given are the ones the plan puts on this rank."""
        plan, where = self.plan, f"hp_recompute.pipelining: {self.plan.path}"
        if self.pp_group_size != plan.num_ranks:
            raise RunError(f"{where}: the plan has {plan.num_ranks} ranks, the stages' group has {self.pp_group_size}")
        if self._num_stages != plan.num_stages:
            raise RunError(f"{where}: the plan has {plan.num_stages} stages, the stages say {self._num_stages}")
        if n_microbatches != plan.num_microbatches:
            raise RunError(f"{where}: the plan has {plan.num_microbatches} microbatches, n_microbatches is "
                           f"{n_microbatches}")
        want = [s for s, r in enumerate(plan.stage_to_rank) if r == self.rank]
        have = [s.stage_index for s in self._stages]
        if have != want:
            raise RunError(f"{where}: rank {self.rank} runs stages {want} in the plan, but was given stages {have}")

    # -- one step ------------------------------------------------------------------------

    def _step_microbatches(self, arg_mbs: Optional[list] = None, kwarg_mbs: Optional[list] = None,
                           target_mbs: Optional[list] = None, losses: Optional[list] = None,
                           return_outputs: bool = True, loss_kwargs: Optional[Dict[str, Any]] = None) -> None:
        arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
        first_target = target_mbs[0] if target_mbs is not None else None
        with plain_forwards():  # Rule 6
            self._initialize_stages(arg_mbs[0], kwarg_mbs[0], first_target, loss_kwargs)
        run = _StepRun(self, arg_mbs, kwarg_mbs, target_mbs, return_outputs, loss_kwargs)
        for index, action in enumerate(self.program):
            try:
                run.perform(action)
            except Exception as e:  # noqa: BLE001 - re-raised with the action that failed
                run.abandon()
                if isinstance(e, RunError):
                    raise
                raise RunError(f"hp_recompute.pipelining: rank {self.rank} action {index} ({action.describe()}): "
                               f"{type(e).__name__}: {e}") from e
        run.finish()
        self._internal_losses = [run.losses[mb] for mb in sorted(run.losses)]
        self._update_losses(self._stages, losses)


class _StepRun:
    """The state of one ``step``: pending receives and sends, handles, backward counts."""

    def __init__(self, schedule: PlannedSchedule, arg_mbs: list, kwarg_mbs: list, target_mbs: Optional[list],
                 return_outputs: bool, loss_kwargs: Optional[Dict[str, Any]]) -> None:
        self.schedule = schedule
        self.scope = schedule.session_scope  # Rule 4
        self.stages = {s.stage_index: s for s in schedule._stages}
        self.arg_mbs, self.kwarg_mbs, self.target_mbs = arg_mbs, kwarg_mbs, target_mbs
        self.return_outputs, self.loss_kwargs = return_outputs, loss_kwargs
        self.posted: Dict[Tuple[str, int, int], list] = {}  # (kind, receiving stage, mb) -> works
        self.send_order = schedule._send_order  # peer -> what it sends us, in order (Rule 3a)
        self.next_recv = {peer: 0 for peer in self.send_order}
        self.sends: List[list] = []
        self.handles: Dict[Tuple[int, int], list] = {}
        self.backwards: Counter = Counter()
        self.losses: Dict[int, torch.Tensor] = {}

    def perform(self, a: Action) -> None:
        op, key = a.op, (a.stage, a.microbatch)
        if op in ("idle", "unshard", "reshard") or a.stage < 0:  # no FSDP unshard in plans yet
            return
        stage = self.stages[a.stage]
        if op in ("recv_f", "recv_b"):
            self._post_until((op[-1], a.stage, a.microbatch), a.peer)
        elif op == "send_f":
            self.sends.append(_batch_p2p(stage.get_fwd_send_ops(a.microbatch)))
        elif op == "send_b":
            self.sends.append(_batch_p2p(stage.get_bwd_send_ops(a.microbatch)))
        elif op == "forward":
            self._forward(stage, a)
        elif op == "recompute":
            for handle in self.handles[key]:
                self.scope.recompute_handle(handle, a.session)
        elif op == "clear":
            self.scope.clear_recompute_session(a.session)
        elif op in ("backward_input", "backward_weight", "backward"):
            self._backward(stage, a)
        elif op == "reduce_grad":
            self._reduce(stage)

    def _post_until(self, key: Tuple[str, int, int], peer: int) -> None:
        """Rule 3a: posts the receives from ``peer`` in its send order, up to ``key``."""
        order = self.send_order[peer]
        while key not in self.posted:
            kind, stage, mb = order[self.next_recv[peer]]
            self.next_recv[peer] += 1
            recv = self.stages[stage].get_fwd_recv_ops if kind == "f" else self.stages[stage].get_bwd_recv_ops
            self.posted[(kind, stage, mb)] = _batch_p2p(recv(mb))

    def _wait(self, key: Tuple[str, int, int]) -> None:
        works = self.posted.pop(key, None)
        if works is None:
            raise RunError(f"hp_recompute.pipelining: rank {self.schedule.rank}: no receive of "
                           f"{'input' if key[0] == 'f' else 'gradient'} for stage {key[1]} mb {key[2]} before its use")
        _wait_batch_p2p(works)

    def _forward(self, stage: Any, a: Action) -> None:
        mb = a.microbatch
        if not stage.is_first and a.stage - 1 not in self.stages:
            self._wait(("f", a.stage, mb))
        with recompute_handle_collector_ctx() as handles:
            if a.plain:
                with plain_forwards():
                    out = stage.forward_one_chunk(mb, self.arg_mbs[mb], self.kwarg_mbs[mb],
                                                  save_forward_output=self.return_outputs)
            else:
                out = stage.forward_one_chunk(mb, self.arg_mbs[mb], self.kwarg_mbs[mb],
                                              save_forward_output=self.return_outputs)
        self.handles[(a.stage, mb)] = handles
        if stage.is_last and self.schedule._loss_fn is not None:  # by microbatch: any forward order works
            self.losses[mb] = self.schedule._compute_loss(out, self.target_mbs[mb], self.loss_kwargs)
        if a.stage + 1 in self.stages:  # Rule 2
            self.stages[a.stage + 1].set_local_fwd_input(out, mb)

    def _backward(self, stage: Any, a: Action) -> None:
        mb, op = a.microbatch, a.op
        if op != "backward_weight" and not stage.is_last and a.stage + 1 not in self.stages:
            self._wait(("b", a.stage, mb))
        session = (self.scope.recompute_session_ctx(a.session, a.retain_on_unpack) if a.session is not None
                   else contextlib.nullcontext())
        with session:
            if op == "backward_weight":
                self.backwards[a.stage] += 1
                stage.backward_weight_one_chunk(mb, last_backward=self._last(a.stage))
            else:
                full = op == "backward"
                if full:
                    self.backwards[a.stage] += 1
                stage.backward_one_chunk(mb, loss=self.losses.get(mb) if stage.is_last else None,
                                         full_backward=full, last_backward=full and self._last(a.stage))
        if op != "backward_weight" and a.stage - 1 in self.stages:  # Rule 2
            self.stages[a.stage - 1].set_local_bwd_input(stage.get_local_bwd_output(mb), mb)
        if op != "backward_input" and self._last(a.stage) and a.stage not in self.schedule._reduces:
            self._reduce(stage)  # Rule 5

    def _last(self, stage: int) -> bool:
        return self.backwards[stage] == self.schedule._n_microbatches

    def _reduce(self, stage: Any) -> None:
        stage.perform_reduce_grad(self.schedule._n_microbatches if self.schedule.scale_grads else 1)

    def abandon(self) -> None:
        """After a failure: the schedule's sessions are cleared (no replayed tensor outlives the step)."""
        self.scope.clear_all()

    def finish(self) -> None:
        while self.sends:
            _wait_batch_p2p(self.sends.pop())
        left = self.scope.clear_all()  # Rule 4
        if left:
            raise RunError(f"hp_recompute.pipelining: rank {self.schedule.rank}: sessions {left} were recomputed "
                           f"but not cleared by the end of the step; the plan must clear every session")
