"""``PlannedSchedule``: torch.distributed.pipelining stages driven by an hp-recompute plan.

NOTE [ Executing a plan with torch's stages ]
=============================================
torch's schedules (``ScheduleZBVZeroBubble``, ``ScheduleInterleavedZeroBubble``, ...) own
the action order; their action set has no recompute and no clear. ``PlannedSchedule`` takes
the order from the plan (NOTE [ Executing a plan ] in plan/interpreter.py) and keeps
everything else torch's: stage objects, metadata inference, microbatch splitting, loss,
point-to-point ops, gradient scaling. This module implements the rules below;
docs/rules.md states each one and why:

  hpr.stages.construction-checks   the plan and the stages checked at construction, on every rank
  hpr.stages.plan-placement        stages where the plan puts them
  hpr.stages.torch-actions         each action is torch's own stage call
  hpr.stages.own-scope             a schedule owns its sessions
  hpr.stages.one-reduce-grad       one ``reduce_grad`` per stage, after its last W and B
  hpr.stages.plain-inference       torch's metadata inference replays nothing and keeps the gradients
  hpr.stages.our-split             split stages run hp_recompute's split (torch 2.13)
  hpr.stages.frozen-inputs         after frozen stages, W is the whole backward
  hpr.stages.plan-owns-gathers     on FSDP stages the plan owns the gathers
  hpr.stages.regions-each-step     each step runs its own plan's regions
  hpr.stages.microbatched-step     ``step`` takes microbatches already split
  hpr.stages.step-buffers          receive buffers live as the plan counts them
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.pipelining._backward import stage_backward
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, _batch_p2p, _wait_batch_p2p
from torch.distributed.pipelining.stage import _PipelineStageBase

from .. import compile_split
from ..backward_split import WeightGradState, accumulate_grad, backward_input, backward_weight
from ..errors import RunError
from ..fsdp import begin_step, discard_step, is_fsdp_module, reduce_gradients
from ..plan.interpreter import PlanInterpreter, StageBackend, plain_forwards, run_step
from ..plan.reader import Action, Plan, region_checkpoint
from ..plan.verify import admit_plan, load_plan
from ..sessions import SessionScope
from .regions import check_regions, patch_regions, unplanned_blocks
from .torch_csv import load_torch_csv

__all__ = ["PlannedSchedule", "admitted_plan"]

PlanSource = Union[str, os.PathLike, Dict[str, Any], Plan]


def admitted_plan(plan: PlanSource) -> Plan:
    """hpr.stages.construction-checks: the plan (a path, a torch CSV, a plan dict or a ``Plan``),
    admitted by the planner's verifier (every rank's program, not only ours); else ``RunError``."""
    if isinstance(plan, Plan):
        return admit_plan(plan.raw, plan.path)
    if isinstance(plan, dict):
        return admit_plan(plan, "<plan dict>")
    path = os.fspath(plan)
    if path.endswith(".csv"):
        return load_torch_csv(path)
    return load_plan(path)


def _is_compiled(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None or "_orig_mod" in module._modules


def planned_splits(program: Sequence[Action]) -> Set[int]:
    """The stages whose backward ``program`` splits into I and W."""
    return {a.stage for a in program if a.op == "backward_weight"}


def split_stages(stages: Sequence[Any], program: Sequence[Action],
                 releases: Callable[[int], bool] = lambda stage: False) -> Set[int]:
    """hpr.stages.our-split: indices of the stages whose backward the plan splits into I and W,
    where that split is hp_recompute's: FSDP2 or compiled stages, and every other one where
    torch has the stage caches it reads (torch 2.13). ``releases(stage)``: the plan prices that
    stage's sessions as released after I (hpr.split.release-unread), which torch's I does not
    do, so such a stage is refused where the caches are missing."""
    split = planned_splits(program)
    found: Dict[int, str] = {}
    for stage in stages:
        if stage.stage_index not in split:
            continue
        modules = list(stage.submod.modules())
        if any(is_fsdp_module(m) for m in modules):  # compiled blocks in it too
            found[stage.stage_index] = "holds FSDP2 modules (fully_shard)"
        elif compile_split.SUPPORTED and any(_is_compiled(m) for m in modules):
            found[stage.stage_index] = "holds compiled modules"
        elif hasattr(stage, "_stage_meta") or releases(stage.stage_index):
            found[stage.stage_index] = "has sessions the plan prices as released after dx (replay_weight_bytes)"
    for stage in stages:
        if stage.stage_index in found and not hasattr(stage, "_stage_meta"):
            raise RunError(f"hp_recompute.pipelining: stage {stage.stage_index} {found[stage.stage_index]} and "
                           f"the plan splits its backward into backward_input and backward_weight, which needs "
                           f"torch's stage caches as torch 2.13 has them; torch {torch.__version__} has another "
                           f"layout: plan it without a dx/dw split (e.g. --schedule-gen 1f1b or interleaved 1F1B)")
    return set(found)


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
        refusal: Optional[Exception] = None
        # stage -> its planned regions (hpr.stages.regions-each-step)
        self._regions: Dict[int, Dict[str, torch.nn.Module]] = {}
        self._given_microbatches: Optional[Tuple[Any, Any, Any]] = None  # hpr.stages.microbatched-step, during one step
        # hpr.stages.construction-checks (torch's own checks of the stages too: a rank stopping alone would hang the
        # others)
        try:
            super().__init__(list(stages), n_microbatches, loss_fn, **kwargs)
            self.plan = admitted_plan(plan)
            self._check_stages(n_microbatches)
            for stage in self._stages:
                fqns = self.checkpointed_regions(stage.stage_index)
                regions = check_regions(stage.submod, fqns, stage.stage_index,
                                        self.checkpointed_regions(stage.stage_index, "selective"))
                self._regions[stage.stage_index] = dict(zip(fqns, regions))
        except Exception as e:  # noqa: BLE001 - raised on every rank below
            refusal = e
        self._refuse_together(stages[0].group, refusal)
        #: stages whose backwards are hp_recompute's split (hpr.stages.our-split)
        self.own_split = split_stages(self._stages, self.plan.ranks[self.rank], self._releases_after_dx)
        mapping = {s: r for s, r in enumerate(self.plan.stage_to_rank)}
        self.stage_index_to_group_rank = mapping
        for stage in self._stages:  # hpr.stages.plan-placement
            stage.stage_index_to_group_rank = mapping
        self._apply_regions()
        self.program: List[Action] = self.plan.ranks[self.rank]
        self.session_scope = SessionScope(f"PlannedSchedule {self.plan.path} rank {self.rank}")  # hpr.stages.own-scope

    @staticmethod
    def _refuse_together(group: Any, refusal: Optional[Exception]) -> None:
        """hpr.stages.construction-checks: a rank that refuses stops every rank, before any runs (the
        others would wait for it at their first transfer): one all-gather of the verdicts over the
        stages' group."""
        verdicts: List[Optional[str]] = [None] * dist.get_world_size(group)
        dist.all_gather_object(verdicts, None if refusal is None else f"{type(refusal).__name__}: {refusal}",
                               group=group)
        if refusal is not None:
            raise refusal
        refused = [(rank, verdict) for rank, verdict in enumerate(verdicts) if verdict is not None]
        if refused:
            rank, verdict = refused[0]
            raise RunError(f"hp_recompute.pipelining: rank {dist.get_rank(group)} does not run: pipeline rank {rank} "
                           f"refused the plan and its stages ({verdict})")

    def _apply_regions(self) -> None:
        """hpr.stages.regions-each-step: this plan's regions checkpointed as it says, every other module as it was."""
        for stage in self._stages:
            patch_regions(stage.submod, self._regions[stage.stage_index],
                          self.checkpointed_regions(stage.stage_index, "selective"))

    def checkpointed_regions(self, stage: int, policy: Optional[str] = None) -> List[str]:
        """FQNs of the regions the plan checkpoints in ``stage``; with ``policy`` (``"full"``,
        ``"selective"``), only those it checkpoints so."""
        return [r["name"] for r in self.plan.stages[stage]
                if region_checkpoint(r) != "none" and policy in (None, region_checkpoint(r))]

    def _releases_after_dx(self, stage: int) -> bool:
        """Whether the plan prices ``stage``'s sessions with what I leaves for W: a fully
        checkpointed region of it carries ``replay_weight_bytes``. Only hp_recompute's I
        releases the rest (hpr.stages.our-split)."""
        return any(region_checkpoint(r) == "full" and "replay_weight_bytes" in r for r in self.plan.stages[stage])

    def _check_stages(self, n_microbatches: int) -> None:
        """hpr.stages.construction-checks: the stages given are the ones the plan puts on this rank."""
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
        for stage in self._stages:
            regions = [r["name"] for r in plan.stages[stage.stage_index]]
            extra = unplanned_blocks(stage.submod, regions)
            if extra:
                raise RunError(f"{where}: stage {stage.stage_index}'s module holds {', '.join(extra)}, which the "
                               f"plan does not place in that stage (its regions: {', '.join(regions)}), so their "
                               f"memory and replays are not the plan's: plan this model and split")
        owners: Dict[int, Tuple[int, str]] = {}
        fsdp = {s.stage_index: any(is_fsdp_module(m) for m in s.submod.modules()) for s in self._stages}
        for stage in self._stages:
            for name, param in stage.submod.named_parameters():
                first = owners.setdefault(id(param), (stage.stage_index, name))
                sharded = [s for s in (first[0], stage.stage_index) if fsdp[s]]
                if first[0] != stage.stage_index and sharded:
                    raise RunError(f"{where}: '{name}' of stage {stage.stage_index} is '{first[1]}' of stage "
                                   f"{first[0]} (one parameter in two stages of rank {self.rank}, tied weights), "
                                   f"and stage {sharded[0]} holds FSDP modules, whose gradients FSDP reduces per "
                                   f"module: untie the weights")
        split = planned_splits(plan.ranks[self.rank])
        for stage in self._stages:
            if getattr(stage, "dw_builder", None) is not None and stage.stage_index in split:
                raise RunError(f"{where}: stage {stage.stage_index} was built with dw_builder, so torch runs its whole "
                               f"backward in backward_input and only the builder's function in backward_weight; the "
                               f"plan splits that backward into I and W, each reading its session where it is "
                               f"placed (the first stage's in W alone), so its replays would run outside the plan: "
                               f"build the stage without dw_builder (PlannedSchedule splits I and W itself)")

    # -- one step ------------------------------------------------------------------------

    def step(self, *args: Any, target: Any = None, losses: Optional[list] = None, arg_mbs: Optional[list] = None,
             kwarg_mbs: Optional[list] = None, target_mbs: Optional[list] = None, **kwargs: Any) -> Any:
        """torch's ``step`` (whole-batch ``args``, ``kwargs`` and ``target``, split into
        microbatches), or torch's newer microbatched call that torchtitan 0.3 makes:
        ``arg_mbs`` (one tuple of positional inputs per microbatch; None past the first
        stage), ``kwarg_mbs`` (one dict per microbatch) and ``target_mbs`` (one target per
        microbatch; None before the last stage), already split. ``return_outputs`` and
        ``loss_kwargs`` go to torch's ``step`` either way; ``eval`` takes the same."""
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return super().step(*args, target=target, losses=losses, **kwargs)
        model_kwargs = [k for k in kwargs if k not in ("return_outputs", "loss_kwargs")]
        if args or target is not None or model_kwargs:
            given = ["positional inputs"] * bool(args) + ["target"] * (target is not None) + model_kwargs
            raise RunError(f"hp_recompute.pipelining: step got microbatches (arg_mbs, kwarg_mbs, target_mbs) and "
                           f"whole-batch inputs ({', '.join(given)}); give one of the two")
        self._given_microbatches = (arg_mbs, kwarg_mbs, target_mbs)
        # torch's step: its checks, per-step stage state and merged outputs; no split (hpr.stages.microbatched-step)
        try:
            return super().step(losses=losses, **kwargs)
        finally:
            self._given_microbatches = None

    def _step_microbatches(self, arg_mbs: Optional[list] = None, kwarg_mbs: Optional[list] = None,
                           target_mbs: Optional[list] = None, losses: Optional[list] = None,
                           return_outputs: bool = True, loss_kwargs: Optional[Dict[str, Any]] = None) -> None:
        given = self._given_microbatches
        if given is not None:  # hpr.stages.microbatched-step: step's microbatches, not torch's split of no inputs
            arg_mbs, kwarg_mbs, target_mbs = given
        arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
        # hpr.stages.regions-each-step: another schedule over these stages may have applied its plan since
        self._apply_regions()
        first_target = target_mbs[0] if target_mbs is not None else None
        params = [p for stage in self._stages for p in stage.submod.parameters()]
        grads = [p.grad for p in params]
        # When torch's _initialize_stages infers again (its condition in torch 2.13's schedules.py;
        # a torch without those flags: always, restoring what an inference did not change).
        forward_done = getattr(self, "_stages_forward_initialized", False)
        infers = not forward_done or self._has_backward != getattr(self, "_stages_backward_initialized", False)
        # hpr.stages.plain-inference: inference's forward does not count for buffers a forward updates (BatchNorm's
        # statistics)
        buffers = [(b, b.clone()) for stage in self._stages for b in stage.submod.buffers()] if infers else []
        with plain_forwards():  # hpr.stages.plain-inference
            self._initialize_stages(arg_mbs[0], kwarg_mbs[0], first_target, loss_kwargs)
        for param, grad in zip(params, grads):  # hpr.stages.plain-inference: what inference's cleanup dropped
            param.grad = grad
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)
        stages = _TorchStages(self, arg_mbs, kwarg_mbs, target_mbs, return_outputs, loss_kwargs)
        stages.drop_all_buffers()  # hpr.stages.step-buffers: inference's, or those a failed step left
        # eval(), or no loss function: the plan's forward side alone (hpr.exec.forward-only); each parameter's
        # gradients scaled once, at its last reduce_grad here (hpr.exec.gradient-scaling)
        run = PlanInterpreter("hp_recompute.pipelining", self.plan, self.rank, stages, self.session_scope,
                              forward_only=not self._has_backward,
                              grad_scale=self._n_microbatches if self.scale_grads else 1)
        try:
            if self._has_backward:  # hpr.stages.plan-owns-gathers: the plan owns the gathers
                for stage in self._stages:
                    if stages.fsdp_modules(stage.stage_index):
                        begin_step(stage.submod, hold_parameters=True)
            left = run_step([run])
        except BaseException:
            # hpr.stages.plan-owns-gathers: no half-accumulated FSDP step outlives a failed one
            for stage in self._stages:
                if stages.fsdp_modules(stage.stage_index):
                    discard_step(stage.submod)
            stages.reshard_all()  # hpr.stages.plan-owns-gathers
            raise
        finally:
            stages.drop_all_buffers()  # hpr.stages.step-buffers
        if left:  # hpr.stages.own-scope
            raise RunError(f"hp_recompute.pipelining: rank {self.rank}: sessions {left} were recomputed but not "
                           f"cleared by the end of the step; the plan must clear every session")
        self._internal_losses = [stages.losses[mb] for mb in sorted(stages.losses)]
        self._update_losses(self._stages, losses)


def _detach_outputs(stage: _PipelineStageBase, stage_output: Any) -> None:
    """After the last stage's backward its outputs are only returned to the user: detached,
    as torch's ``backward_one_chunk`` does (its graph is freed)."""
    if stage.is_last and not stage.is_first:
        for t in stage_output:
            if not t._is_view():
                t.detach_()


def _allocate_buffers(infos: Sequence[Any], device: torch.device) -> None:
    """hpr.stages.step-buffers: a new buffer for each receive of ``infos`` (torch's ``_RecvInfo`` of one
    microbatch) that carries a tensor, allocated as torch's stage allocates it."""
    from torch.distributed.pipelining._utils import _make_tensor_from_meta  # torch 2.13's stage caches

    for info in infos:
        if not info.is_root_arg and info.tensor_meta is not None:
            info.buffer = _make_tensor_from_meta(info.tensor_meta, device)


def _drop_buffers(stage: _PipelineStageBase, mb: int) -> None:
    """hpr.stages.step-buffers: the stage's input and output-gradient buffers of ``mb`` hold nothing."""
    for info in (*stage.args_recv_info.get(mb, ()), *stage.grad_recv_info.get(mb, ())):
        if not info.is_root_arg:
            info.buffer = None


class _TorchStages(StageBackend):
    """This rank's torch stages for one ``step`` (hpr.stages.torch-actions): pending receives and sends, losses."""

    def __init__(self, schedule: PlannedSchedule, arg_mbs: list, kwarg_mbs: list, target_mbs: Optional[list],
                 return_outputs: bool, loss_kwargs: Optional[Dict[str, Any]]) -> None:
        self.schedule = schedule
        self.stages = {s.stage_index: s for s in schedule._stages}
        self.arg_mbs, self.kwarg_mbs, self.target_mbs = arg_mbs, kwarg_mbs, target_mbs
        self.return_outputs, self.loss_kwargs = return_outputs, loss_kwargs
        self.posted: Dict[Tuple[str, int, int], list] = {}  # (kind, receiving stage, mb) -> works
        self.sends: List[list] = []
        self.losses: Dict[int, torch.Tensor] = {}
        # (stage, mb) -> I's state for W (hpr.stages.our-split)
        self.weight_states: Dict[Tuple[int, int], WeightGradState] = {}
        # stages unsharded by the plan and not yet resharded (hpr.stages.plan-owns-gathers)
        self.gathered: Set[int] = set()
        # stage -> its gathers' handles, until a reader waits (hpr.stages.plan-owns-gathers)
        self.pending: Dict[int, list] = {}
        #: receive buffers of this step only (hpr.stages.step-buffers), where torch has the stage caches (torch 2.13)
        self.fresh_buffers = all(hasattr(s, "_stage_meta") for s in schedule._stages)

    def post_recv(self, a: Action) -> None:
        stage = self.stages[a.stage]
        if self.fresh_buffers:  # hpr.stages.step-buffers
            infos = stage.args_recv_info if a.op == "recv_f" else stage.grad_recv_info
            _allocate_buffers(infos[a.microbatch], stage.device)
        recv = stage.get_fwd_recv_ops if a.op == "recv_f" else stage.get_bwd_recv_ops
        self.posted[(a.op, a.stage, a.microbatch)] = _batch_p2p(recv(a.microbatch))

    def wait_recv(self, a: Action) -> None:
        _wait_batch_p2p(self.posted.pop((a.op, a.stage, a.microbatch)))

    def send(self, a: Action) -> None:
        stage = self.stages[a.stage]
        ops = stage.get_fwd_send_ops(a.microbatch) if a.op == "send_f" else stage.get_bwd_send_ops(a.microbatch)
        self.sends.append(_batch_p2p(ops))

    def flush(self) -> None:
        while self.sends:
            _wait_batch_p2p(self.sends.pop())

    def forward(self, a: Action) -> Any:
        stage, mb = self.stages[a.stage], a.microbatch
        out = stage.forward_one_chunk(mb, self.arg_mbs[mb], self.kwarg_mbs[mb], save_forward_output=self.return_outputs)
        if stage.is_last and self.schedule._loss_fn is not None:
            self.losses[mb] = self.schedule._compute_loss(out, self.target_mbs[mb], self.loss_kwargs)
        return out

    def release(self, stage: int, mb: int) -> None:
        """hpr.stages.torch-actions: the last stage's loss of ``mb`` is only returned from its last backward on.
        hpr.stages.step-buffers: the stage's received or handed-over input and output gradient of ``mb`` are dropped."""
        if mb in self.losses and self.stages[stage].is_last:
            self.losses[mb] = self.losses[mb].detach()
        if self.fresh_buffers:
            _drop_buffers(self.stages[stage], mb)

    def drop_all_buffers(self) -> None:
        """hpr.stages.step-buffers: no stage of this rank holds a receive buffer or a handed-over tensor."""
        if self.fresh_buffers:
            for stage in self.stages.values():
                for mb in range(self.schedule._n_microbatches):
                    _drop_buffers(stage, mb)

    def pass_forward(self, a: Action, output: Any) -> None:
        self.stages[a.hands_to].set_local_fwd_input(output, a.microbatch)

    def pass_backward(self, a: Action) -> None:
        grads = self.stages[a.stage].get_local_bwd_output(a.microbatch)
        self.stages[a.hands_to].set_local_bwd_input(grads, a.microbatch)

    def input_requires_grad(self, a: Action) -> bool:
        """hpr.stages.frozen-inputs: whether any input of the stage's forward of ``a``'s microbatch needs a gradient."""
        return any(isinstance(x, torch.Tensor) and x.requires_grad
                   for x in self.stages[a.stage].fwd_cache[a.microbatch][1])

    def stage_parameters(self, stage: int) -> List[torch.Tensor]:
        return list(self.stages[stage].submod.parameters())

    def backward(self, a: Action, verb: str, last: bool) -> None:
        """The interpreter's verb (hpr.exec.backward-verbs): on torch's stage caches, by torch's stage or by
        hp_recompute's split (``own_split``)."""
        stage, mb = self.stages[a.stage], a.microbatch
        if verb == "none":  # no input gradient to send; W is the whole backward, from the forward's cache
            inputs = stage._stage_meta.inputs if hasattr(stage, "_stage_meta") else stage.fwd_cache[mb][1]
            stage.bwd_cache[mb] = (None,) * len(inputs)
        elif a.stage in self.schedule.own_split:
            self._split_backward(stage, a, verb)
        elif verb == "dw":
            stage.backward_weight_one_chunk(mb, last_backward=last)
        else:
            stage.backward_one_chunk(mb, loss=self.losses.get(mb) if stage.is_last else None,
                                     full_backward=verb == "whole", last_backward=verb == "whole" and last)

    def _split_backward(self, stage: _PipelineStageBase, a: Action, verb: str) -> None:
        """hpr.stages.our-split: dx, dw or the whole backward of an FSDP2 or compiled stage, on torch's
        stage caches, by hp_recompute's split; the whole one is torch's ``stage_backward`` inside the
        step that hpr.stages.plan-owns-gathers opened on an FSDP stage (accumulated, reduced once at
        ``reduce_grad``)."""
        key = (a.stage, a.microbatch)
        if verb == "dw":
            state = self.weight_states.pop(key)
            into_fsdp = state.fsdp is not None  # W itself adds into FSDP's gradients
            grads = backward_weight(state)
            if not into_fsdp:
                accumulate_grad(state.weights, grads)
            return
        stage_output, input_values = stage.fwd_cache.pop(a.microbatch)
        grads = None if stage.is_last else list(stage._retrieve_recv_grads(a.microbatch))
        root = self.losses[a.microbatch] if stage.is_last else stage_output
        if verb == "whole":
            grads_input = stage_backward(root, grads, input_values)
        else:
            outputs = [root] if stage.is_last else list(stage_output)
            pairs = [(o, g) for o, g in zip(outputs, grads or [None] * len(outputs)) if o.requires_grad]
            wants = [isinstance(x, torch.Tensor) and x.requires_grad for x in input_values]
            dx, self.weight_states[key] = backward_input(
                [o for o, _ in pairs], None if grads is None else [g for _, g in pairs],
                [x for x, want in zip(input_values, wants) if want], stage.submod)
            found = iter(dx)
            grads_input = tuple(next(found) if want else None for want in wants)
        stage.bwd_cache[a.microbatch] = tuple(grads_input)[:len(stage._stage_meta.inputs)]
        _detach_outputs(stage, stage_output)

    def fsdp_modules(self, stage: int) -> List[Any]:
        return [m for m in self.stages[stage].submod.modules() if is_fsdp_module(m)]

    def unshard(self, a: Action) -> None:
        """hpr.stages.plan-owns-gathers: FSDP2's all-gather of every FSDP module of the stage, issued
        (``async_op=True``)."""
        self.pending[a.stage] = [module.unshard(async_op=True) for module in self.fsdp_modules(a.stage)]
        self.gathered.add(a.stage)

    def wait_unshard(self, stage: int) -> None:
        """hpr.stages.plan-owns-gathers: the stage's parameters gathered before an action reads or frees them."""
        for handle in self.pending.pop(stage, ()):
            handle.wait()

    def reshard(self, a: Action) -> None:
        """hpr.stages.plan-owns-gathers: frees the stage's gathered parameters."""
        for module in self.fsdp_modules(a.stage):
            module.reshard()
        self.gathered.discard(a.stage)

    def reshard_all(self) -> None:
        """hpr.stages.plan-owns-gathers, after a failed step: nothing the plan gathered stays gathered or in flight."""
        for stage in sorted(self.gathered):
            self.wait_unshard(stage)
            for module in self.fsdp_modules(stage):
                module.reshard()
        self.gathered.clear()

    def reduce_grad(self, a: Action) -> None:
        """hpr.stages.plan-owns-gathers: an FSDP stage's gradients reduced once (the interpreter scales
        them after: hpr.exec.gradient-scaling)."""
        if self.fsdp_modules(a.stage):
            reduce_gradients(self.stages[a.stage].submod)
