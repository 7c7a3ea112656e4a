"""``PlannedSchedule``: torch.distributed.pipelining stages driven by an hp-recompute plan.

NOTE [ Executing a plan with torch's stages ]
=============================================
torch's schedules (``ScheduleZBVZeroBubble``, ``ScheduleInterleavedZeroBubble``, ...) own
the action order; their action set has no recompute and no clear, so under
``torch.utils.checkpoint`` every checkpointed block replays once per backward call (twice
with a dx/dw split). ``PlannedSchedule`` takes the order from the plan instead and keeps
everything else torch's: stage objects, metadata inference, microbatch splitting, loss,
point-to-point ops, gradient scaling. The rules below are cited as "Rule N".

Rule 1 (what is checked). At construction, before any module is patched or any step
  runs: the plan's ranks, stages and microbatches match the stages given (``group_size``,
  ``num_stages``, ``n_microbatches``, this rank's stage indices), no stage whose backward
  the plan splits was built with ``dw_builder`` (torch would run its whole backward in I,
  outside the plan's reads), every region the plan checkpoints exists in its stage's
  module and may be checkpointed as planned (``regions.check_regions``), and no stage
  module holds a block the plan does not place there (``regions.unplanned_blocks``: a plan
  for another model or split), and no parameter in two of this rank's stages belongs to a
  stage holding FSDP modules (Rule 11). The plan itself is
  admitted by the planner's reader and verifier (``plan.verify.admit_plan``: every
  rank's program, not only ours). The ranks
  then exchange their verdicts (one all-gather over the stages' group): a refusal on one
  rank is raised on every rank, so none waits for a peer that stopped.

Rule 2 (stage mapping). Stages are placed where the plan puts them
  (``stage_index_to_group_rank`` is the plan's ``stage_to_rank``); a neighbour on the same
  rank gets its tensor in memory (interpreter Rule 2a: ``set_local_fwd_input`` and
  ``set_local_bwd_input``, torch's V-schedule special case).

Rule 3 (actions). The plan's actions are interpreted by ``PlanInterpreter`` (NOTE
  [ Executing a plan ] in plan/interpreter.py: sessions, replays, clears, which receives
  a ``recv`` posts and who waits for them, which backward verb each backward runs, the
  gradient scaling); here each is torch's own: ``forward`` is ``forward_one_chunk``, the
  verbs ``dx``, ``dw`` and ``whole`` are ``backward_one_chunk(full_backward=False)``,
  ``backward_weight_one_chunk`` and ``backward_one_chunk(full_backward=True)``, and
  ``none`` (the first stage's I, Rule 7a's) leaves the stage's input gradients None; the
  transfers are ``get_*_send_ops`` / ``get_*_recv_ops`` batched as torch's runtime does
  them; ``reduce_grad`` is FSDP's reduction on an FSDP stage (Rule 8) and then the
  interpreter's division by ``n_microbatches`` where ``scale_grads`` (torch's
  ``scale_grads``, once per parameter: Rule 11).
  A forward's loss is computed by microbatch, so any forward order works; after the
  microbatch's last backward (the plan's ``frees_graph``) it is detached, so its graph,
  the loss's activations among it, is freed there and not at the end of the step (torch's
  runtime keeps every loss's graph until then). Stages of Rule 7 are the exception.

Rule 4 (sessions). A schedule owns its sessions: they live in its own ``SessionScope``,
  so two schedules (two models) in one process never share a session, even where their
  plans use the same ids. A session that is not cleared by the end of the step is an
  error (the plan promised a clear).

Rule 5 (gradient reduction). The planner puts one ``reduce_grad`` per stage into every
  plan, after the stage's last ``W`` and ``B`` (where torch's ``_add_reduce_grad`` puts
  it), and the admission check refuses a plan without it, with it too early or twice
  (gradients scaled too early or twice: wrong, silently).

Rule 6 (metadata inference). On the first step torch's stages infer their input and
  output metadata by running microbatch 0 through the stage module (``_initialize_stages``;
  torch 2.13 runs a forward and a backward there, with real tensors). That runs inside
  ``plain_forwards()``: the plan's regions run plainly, so inference creates no
  checkpoint and replays nothing, and every replay of a step is the plan's (one per
  checkpointed region per microbatch). torch infers again when a schedule switches
  between ``step`` and ``eval``, and then sets the ``.grad`` of every FSDP module's
  parameters to None (its cleanup of the inference's backward): the stages' gradients
  are kept across the inference, so an ``eval`` between two accumulating steps, or
  before the optimizer step, loses none. Buffers are as they were before the inference
  (its forward of microbatch 0 would update BatchNorm's statistics once more than the
  plain model does).

Rule 7 (stages split into I and W by hp_recompute). Every stage whose backward the plan
  splits runs hp_recompute's split where torch has the stage caches it reads (torch 2.13):
  its I releases what no W node reads from the sessions (Rule 9 of NOTE [ dx/dw split ]), as
  the plan prices it (``replay_weight_bytes``); torch's I keeps the whole replay, so on a
  torch without those caches a plan that counts on the release is refused. torch's
  ``backward_one_chunk(full_backward=False)`` and ``backward_weight_one_chunk`` are not
  right at all for two kinds of stages whose backward the plan splits (``split_stages``):
  - FSDP2 stages: they differentiate ``submod.parameters()``, which FSDP2 has swapped for
    sharded DTensors by then (``reshard_after_forward=True``): W gets no or wrong
    gradients, silently (torch's own ZBV too);
  - compiled stages (a module compiled in place, ``checkpoint_wrapper(block).compile()``
    included, or a ``torch.compile``-d module): a compiled block is one autograd node, and
    torch's I and W each run its whole backward (I + W = 2x the matmul work). Ours tell
    the node which half to run (NOTE [ Compiled dx/dw split ] Rule 4), on torch >= 2.13.
  A stage that is both (torchtitan's order: ``checkpoint_wrapper`` each block, then its
  ``compile()``, then ``fully_shard`` each block and the stage) is split the same way. Its
  compiled nodes save tensors in FSDP's unsharded parameter storage, which FSDP frees when
  it reshards; Rule 8 keeps that storage gathered from the stage's first gather to its
  ``reshard`` or ``reduce_grad``, after its last W, so W reads them allocated. (Before
  Rule 8, FSDP resharded between I and W and such a W failed: "data is not allocated".)
  Their backwards are hp_recompute's (NOTE [ dx/dw split ], NOTE [ FSDP2 and the dx/dw
  split ] in fsdp.py), on torch's stage caches: ``I`` is ``backward_input(outputs, output
  grads, inputs, submod)``, ``W`` is ``backward_weight`` of its state (added into each
  parameter's ``.grad`` as autograd would, or into FSDP's gradients), a ``B`` of the same
  stage is torch's ``stage_backward`` (on an FSDP stage inside the step ``fsdp.begin_step``
  opened: nothing reduced). The first stage's I computes nothing and its W is
  ``stage_backward``, the whole backward, as torch runs that stage's I and W and as the
  plan reads them (its I names no session): a step input that requires grad gets its
  ``.grad`` there, as under torch's schedule. An FSDP stage's ``reduce_grad`` is Rule 8's.
  The input gradients go where torch's
  would (``bwd_cache``), so sends and co-located handoffs are torch's. A replay of a block
  wrapped with ``checkpoint_wrapper`` before ``fully_shard`` runs unsharded (fsdp.py Rule
  6). Needs torch's stage caches as torch 2.13 has them (``_stage_meta``); another torch
  is refused at construction.

Rule 7a (stages after frozen ones). torch's I of a stage none of whose inputs needs a
  gradient (the stages before it frozen, ``requires_grad_(False)``) computes nothing, and
  its W then has no gradient of the stage's outputs to start from: every weight gradient
  of the stage stays None, silently (torch's own ZBV too). Here the interpreter runs such
  an I as ``none`` and its W as ``whole`` (interpreter Rule 4, as it runs the first
  stage's), decided per microbatch at I, where the inputs are known
  (``input_requires_grad``). The session the plan names is read by that W alone, and its
  replay is held from I to W as planned.

Rule 8 (the plan owns the gathers). On a stage holding FSDP modules a training step
  holds the parameters (``fsdp.begin_step(..., hold_parameters=True)`` before the first
  action): FSDP reshards nothing and reduces nothing by itself during the step, so each
  FSDP module is gathered once per window and neither a forward, I, W, B nor a
  prefetched replay gathers it again; its ``reduce_grad`` is ``fsdp.reduce_gradients``
  (one reduce-scatter per parameter group, plus HSDP's all-reduce) followed by the
  interpreter's scaling, whichever runtime ran its backwards (Rule 7's or torch's). A
  plan made for FSDP (``hp-recompute-plan --dp-shard N``) bounds the window: an ``unshard`` of each stage
  before the first action that reads its parameters (a prefetched replay included) and
  a ``reshard`` after the last, FSDP2's public ``unshard(async_op=True)`` and ``reshard()``
  of every FSDP module in the stage, as torch's runtime lowers its UNSHARD / RESHARD
  actions: the gathers run beside the compute the plan put between an ``unshard`` and the
  stage's next reader, which waits for them (interpreter Rule 8). A plan without them gets one window
  per stage per step, from FSDP's first gather to ``reduce_grad`` (which reshards as the
  modules were configured): what such a plan prices, every parameter resident for the
  step. No parameter stays gathered past its ``reshard`` or the step, and a failed step
  reshards what it gathered. On a stage without FSDP modules both do nothing.

Rule 9 (the plan's regions, each step). The plan's regions are checkpointed in place
  (``regions.py``), on modules that another ``PlannedSchedule`` may share (an eval
  schedule built with another plan): each schedule applies its own plan's patches before
  each step (``regions.patch_regions``), so a step runs its own plan's checkpoints and
  replays, whichever schedule was built or stepped last. A region's keywords reach the
  region, and its replays leave its buffers as its forward left them (BatchNorm's
  statistics are updated once per microbatch, as in the plain model).

Rule 10 (microbatched steps). ``step`` also takes the microbatches already split
  (``arg_mbs``, ``kwarg_mbs``, ``target_mbs``: torch's newer call, torchtitan 0.3's
  ``step`` and ``eval``), each list one entry per microbatch; torch's checks, per-step
  stage state and output merging run as for a whole batch, and its split is skipped.
  Whole-batch inputs beside them are refused (which should win is not said).

Rule 11 (tied weights on one rank). A parameter two of this rank's stages hold (GPT-2's
  embedding and head on a V-shaped schedule's first rank) gets both stages' gradients in
  one ``.grad``; torch's per-stage ``scale_grads`` would divide it at each stage's
  ``reduce_grad``, the first time before all of it is in (silently wrong, torch's own ZBV
  too). Here it is divided once, at the last ``reduce_grad`` of this rank that covers it
  (the interpreter's scaling, interpreter Rule 8, for both runtimes).

Rule 12 (receive buffers live as the plan counts them). torch's stages receive into
  buffers allocated once (at metadata inference) and kept across steps, and a co-located
  stage keeps the tensor handed to it until the next step's handoff replaces it. The plan,
  as the runner's transport, counts a received or handed-over tensor from its receive or
  handoff to the last backward of its microbatch at the stage that reads it
  (lib/Analysis/StepMemory.cpp: an output gradient from its ``recv_b`` or dx handoff;
  ActivationModel.cpp: the stage input among what its forward keeps). So, on torch's
  stage caches (torch 2.13), each ``recv_f`` and ``recv_b`` receives into a buffer
  allocated when it is posted (as torch allocates it: ``_make_tensor_from_meta``; one
  posted ahead of its place, in the peer's send order, is live from there, before the
  plan counts it), a handoff sets the buffer as torch's ``set_local_*_input`` does, and
  after the plan's last backward of (stage, microbatch) (``frees_graph``: ``release``)
  both of that stage's buffers of the microbatch are dropped; every buffer is dropped
  before each step runs and after it ends, so none outlives a step (a forward-only step
  has no last backward). A stage that reads a buffer no receive or handoff of this step
  filled finds None and torch's stage raises (``_retrieve_recv_activations``,
  ``_retrieve_recv_grads``): never last step's data. Other torches keep their own buffers.
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
    """Rule 1: the plan (a path, a torch CSV, a plan dict or a ``Plan``), admitted by the
    planner's verifier (every rank's program, not only ours); else ``RunError``."""
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
    """Rule 7: indices of the stages whose backward the plan splits into I and W, where that
    split is hp_recompute's: FSDP2 or compiled stages, and every other one where torch has
    the stage caches it reads (torch 2.13). ``releases(stage)``: the plan prices that stage's
    sessions as released after I (Rule 9 of NOTE [ dx/dw split ]), which torch's I does not do,
    so such a stage is refused where the caches are missing."""
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
        self._regions: Dict[int, Dict[str, torch.nn.Module]] = {}  # stage -> its planned regions (Rule 9)
        self._given_microbatches: Optional[Tuple[Any, Any, Any]] = None  # Rule 10, during one step
        try:  # Rule 1 (torch's own checks of the stages too: a rank stopping alone would hang the others)
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
        #: stages whose backwards are hp_recompute's split (Rule 7)
        self.own_split = split_stages(self._stages, self.plan.ranks[self.rank], self._releases_after_dx)
        mapping = {s: r for s, r in enumerate(self.plan.stage_to_rank)}
        self.stage_index_to_group_rank = mapping
        for stage in self._stages:  # Rule 2
            stage.stage_index_to_group_rank = mapping
        self._apply_regions()
        self.program: List[Action] = self.plan.ranks[self.rank]
        self.session_scope = SessionScope(f"PlannedSchedule {self.plan.path} rank {self.rank}")  # Rule 4

    @staticmethod
    def _refuse_together(group: Any, refusal: Optional[Exception]) -> None:
        """Rule 1: a rank that refuses stops every rank, before any runs (the others would wait
        for it at their first transfer): one all-gather of the verdicts over the stages' group."""
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
        """Rule 9: this plan's regions checkpointed as it says, every other module as it was."""
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
        releases the rest (Rule 7)."""
        return any(region_checkpoint(r) == "full" and "replay_weight_bytes" in r for r in self.plan.stages[stage])

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
        try:  # torch's step: its checks, per-step stage state and merged outputs; no split (Rule 10)
            return super().step(losses=losses, **kwargs)
        finally:
            self._given_microbatches = None

    def _step_microbatches(self, arg_mbs: Optional[list] = None, kwarg_mbs: Optional[list] = None,
                           target_mbs: Optional[list] = None, losses: Optional[list] = None,
                           return_outputs: bool = True, loss_kwargs: Optional[Dict[str, Any]] = None) -> None:
        given = self._given_microbatches
        if given is not None:  # Rule 10: step's microbatches, not torch's split of no inputs
            arg_mbs, kwarg_mbs, target_mbs = given
        arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
        self._apply_regions()  # Rule 9: another schedule over these stages may have applied its plan since
        first_target = target_mbs[0] if target_mbs is not None else None
        params = [p for stage in self._stages for p in stage.submod.parameters()]
        grads = [p.grad for p in params]
        # When torch's _initialize_stages infers again (its condition in torch 2.13's schedules.py;
        # a torch without those flags: always, restoring what an inference did not change).
        forward_done = getattr(self, "_stages_forward_initialized", False)
        infers = not forward_done or self._has_backward != getattr(self, "_stages_backward_initialized", False)
        # Rule 6: inference's forward does not count for buffers a forward updates (BatchNorm's statistics)
        buffers = [(b, b.clone()) for stage in self._stages for b in stage.submod.buffers()] if infers else []
        with plain_forwards():  # Rule 6
            self._initialize_stages(arg_mbs[0], kwarg_mbs[0], first_target, loss_kwargs)
        for param, grad in zip(params, grads):  # Rule 6: what inference's cleanup dropped
            param.grad = grad
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)
        stages = _TorchStages(self, arg_mbs, kwarg_mbs, target_mbs, return_outputs, loss_kwargs)
        stages.drop_all_buffers()  # Rule 12: inference's, or those a failed step left
        # eval(), or no loss function: the plan's forward side alone (interpreter Rule 13)
        # Rule 11: the interpreter scales each parameter's gradients once, at its last reduce_grad here
        run = PlanInterpreter("hp_recompute.pipelining", self.plan, self.rank, stages, self.session_scope,
                              forward_only=not self._has_backward,
                              grad_scale=self._n_microbatches if self.scale_grads else 1)
        try:
            if self._has_backward:  # Rule 8: the plan owns the gathers
                for stage in self._stages:
                    if stages.fsdp_modules(stage.stage_index):
                        begin_step(stage.submod, hold_parameters=True)
            left = run_step([run])
        except BaseException:
            for stage in self._stages:  # Rule 8: no half-accumulated FSDP step outlives a failed one
                if stages.fsdp_modules(stage.stage_index):
                    discard_step(stage.submod)
            stages.reshard_all()  # Rule 8
            raise
        finally:
            stages.drop_all_buffers()  # Rule 12
        if left:  # Rule 4
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
    """Rule 12: a new buffer for each receive of ``infos`` (torch's ``_RecvInfo`` of one
    microbatch) that carries a tensor, allocated as torch's stage allocates it."""
    from torch.distributed.pipelining._utils import _make_tensor_from_meta  # torch 2.13's stage caches

    for info in infos:
        if not info.is_root_arg and info.tensor_meta is not None:
            info.buffer = _make_tensor_from_meta(info.tensor_meta, device)


def _drop_buffers(stage: _PipelineStageBase, mb: int) -> None:
    """Rule 12: the stage's input and output-gradient buffers of ``mb`` hold nothing."""
    for info in (*stage.args_recv_info.get(mb, ()), *stage.grad_recv_info.get(mb, ())):
        if not info.is_root_arg:
            info.buffer = None


class _TorchStages(StageBackend):
    """This rank's torch stages for one ``step`` (Rule 3): pending receives and sends, losses."""

    def __init__(self, schedule: PlannedSchedule, arg_mbs: list, kwarg_mbs: list, target_mbs: Optional[list],
                 return_outputs: bool, loss_kwargs: Optional[Dict[str, Any]]) -> None:
        self.schedule = schedule
        self.stages = {s.stage_index: s for s in schedule._stages}
        self.arg_mbs, self.kwarg_mbs, self.target_mbs = arg_mbs, kwarg_mbs, target_mbs
        self.return_outputs, self.loss_kwargs = return_outputs, loss_kwargs
        self.posted: Dict[Tuple[str, int, int], list] = {}  # (kind, receiving stage, mb) -> works
        self.sends: List[list] = []
        self.losses: Dict[int, torch.Tensor] = {}
        self.weight_states: Dict[Tuple[int, int], WeightGradState] = {}  # (stage, mb) -> I's state for W (Rule 7)
        self.gathered: Set[int] = set()  # stages unsharded by the plan and not yet resharded (Rule 8)
        self.pending: Dict[int, list] = {}  # stage -> its gathers' handles, until a reader waits (Rule 8)
        #: receive buffers of this step only (Rule 12), where torch has the stage caches (torch 2.13)
        self.fresh_buffers = all(hasattr(s, "_stage_meta") for s in schedule._stages)

    def post_recv(self, a: Action) -> None:
        stage = self.stages[a.stage]
        if self.fresh_buffers:  # Rule 12
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
        """Rule 3: the last stage's loss of ``mb`` is only returned from its last backward on.
        Rule 12: the stage's received or handed-over input and output gradient of ``mb`` are dropped."""
        if mb in self.losses and self.stages[stage].is_last:
            self.losses[mb] = self.losses[mb].detach()
        if self.fresh_buffers:
            _drop_buffers(self.stages[stage], mb)

    def drop_all_buffers(self) -> None:
        """Rule 12: no stage of this rank holds a receive buffer or a handed-over tensor."""
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
        """Rule 7a: whether any input of the stage's forward of ``a``'s microbatch needs a gradient."""
        return any(isinstance(x, torch.Tensor) and x.requires_grad
                   for x in self.stages[a.stage].fwd_cache[a.microbatch][1])

    def stage_parameters(self, stage: int) -> List[torch.Tensor]:
        return list(self.stages[stage].submod.parameters())

    def backward(self, a: Action, verb: str, last: bool) -> None:
        """The interpreter's verb (Rule 7, 7a): on torch's stage caches, by torch's stage or by
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
        """Rule 7: dx, dw or the whole backward of an FSDP2 or compiled stage, on torch's stage
        caches, by hp_recompute's split; the whole one is torch's ``stage_backward`` inside the
        step Rule 8 opened on an FSDP stage (accumulated, reduced once at ``reduce_grad``)."""
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
        """Rule 8: FSDP2's all-gather of every FSDP module of the stage, issued (``async_op=True``)."""
        self.pending[a.stage] = [module.unshard(async_op=True) for module in self.fsdp_modules(a.stage)]
        self.gathered.add(a.stage)

    def wait_unshard(self, stage: int) -> None:
        """Rule 8: the stage's parameters gathered before an action reads or frees them."""
        for handle in self.pending.pop(stage, ()):
            handle.wait()

    def reshard(self, a: Action) -> None:
        """Rule 8: frees the stage's gathered parameters."""
        for module in self.fsdp_modules(a.stage):
            module.reshard()
        self.gathered.discard(a.stage)

    def reshard_all(self) -> None:
        """Rule 8, after a failed step: nothing the plan gathered stays gathered or in flight."""
        for stage in sorted(self.gathered):
            self.wait_unshard(stage)
            for module in self.fsdp_modules(stage):
                module.reshard()
        self.gathered.clear()

    def reduce_grad(self, a: Action) -> None:
        """Rule 8: an FSDP stage's gradients reduced once (the interpreter scales them after)."""
        if self.fsdp_modules(a.stage):
            reduce_gradients(self.stages[a.stage].submod)
