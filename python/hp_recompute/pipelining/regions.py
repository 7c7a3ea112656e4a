"""Checkpointing the plan's regions of a torch ``PipelineStage``'s module, in place.

Why in place: torchtitan and FSDP address parameters by their fully qualified names
(``layers.3.attention.wq.weight``); a wrapper module would insert a level into every
one of them. We replace the *instance's* ``forward`` instead (``nn.Module.__call__``
looks it up on the instance first), so the module tree, its parameter names, its
state dict and its hooks stay as they were. The new forward runs the original one
through ``hp_recompute.checkpoint`` (with the selective policy's ``context_fn`` for a region
the plan checkpoints ``"selective"``), or plainly while ``plan.interpreter.plain_forwards()`` is open (a
forward the plan marks ``"checkpoint": false``).

The region's own keywords reach it whole, also those named like checkpoint options
(``layer(x, debug=True)``: the user wrote no checkpoint call), and its replays leave the
buffers its forward updates as the forward left them (``replay_buffers``). Modules may be
shared by several schedules with different plans: ``patch_regions`` gives them one plan's
patches, and each ``PlannedSchedule`` applies its own before each of its steps.

A region that ``fully_shard`` has made an FSDP module is checkpointed inside FSDP's hooks,
as ``checkpoint_wrapper`` before ``fully_shard`` would be, and its replays gather its
parameters as the wrapper's do (``fsdp.ReplayFunction``).

A region already wrapped with ``hp_recompute.checkpoint_wrapper`` keeps its wrapper (and
its options, a selective policy's ``context_fn`` included); one wrapped by torch's own
checkpoint would replay once per backward call, so it is refused with a message rather
than silently replayed twice. A wrapper's own ``context_fn`` must agree with the plan: a
selective region needs one, and a selective region with a module compiled where the policy
cannot see its ops is refused (hpr.selective.visible-ops); a region the plan checkpoints in
full runs its wrapper's checkpoint without a selective policy (hpr.selective.plan-full: the
plan, under its budget, saves only the region's input there) and refuses any other
``context_fn`` (it would keep what the plan did not price). A wrapper at a module the
plan does not checkpoint runs its module plainly (ours) or is refused (torch's): the plan
places every replay.

A compiled region must be compiled *inside* its checkpoint, as
``checkpoint_wrapper(block).compile()`` does (hpr.compiled-split.wrapper-compile). A
region compiled around it (``torch.compile(block)`` registered in its place, or a plain
block's in-place ``block.compile()``, whose compiled call would trace our checkpoint) has
no recompute handle, so it is refused here, before the first forward.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Collection, Dict, List, Optional, Sequence

import torch

from ..checkpoint import checkpoint as hpr_checkpoint, checkpoint_call
from ..errors import RunError
from ..fsdp import ReplayFunction, is_fsdp_module
from ..hf import hf_checkpointing_on
from ..plan.interpreter import forwards_are_plain
from ..replay_buffers import BufferKeepingFunction, ChangedBuffers
from ..selective import hidden_compiled_modules, is_selective_policy, selective_context_fn

__all__ = ["check_regions", "checkpoint_regions", "patch_regions", "unplanned_blocks"]


class _PlannedForward:
    """A planned region's forward: its own forward through our checkpoint (with the selective
    policy's ``context_fn`` for a region the plan checkpoints ``"selective"``), or plainly
    inside ``plain_forwards()`` and without grad. The region's keywords reach it whole, also
    those named like the checkpoint's options (``debug=``: the user wrote no checkpoint call),
    and its replays leave its buffers as its forward left them (``replay_buffers``)."""

    def __init__(self, region: torch.nn.Module, original: Callable[..., Any],
                 context_fn: Optional[Callable[[], Any]], changed: Optional[ChangedBuffers] = None) -> None:
        self.region, self.original, self.context_fn = region, original, context_fn
        self.changed = changed if changed is not None else ChangedBuffers()

    def with_policy(self, context_fn: Optional[Callable[[], Any]]) -> "_PlannedForward":
        """The same region under another plan's policy (stages reused by another schedule)."""
        return _PlannedForward(self.region, self.original, context_fn, self.changed)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if forwards_are_plain() or not torch.is_grad_enabled():
            return self.original(*args, **kwargs)
        function = BufferKeepingFunction(self.original, self.region, self.changed)
        return checkpoint_call(function, args, kwargs, context_fn=self.context_fn)


class _WrappedForward:
    """A region the user wrapped with ``hp_recompute.checkpoint_wrapper``: its wrapper's
    checkpoint with its options (``context_fn``, ...; without its selective policy where
    ``full``: hpr.selective.plan-full), the replays leaving its buffers as the forward left
    them; its inner module while forwards are plain."""

    def __init__(self, wrapper: torch.nn.Module, full: bool) -> None:
        self.wrapper, self.full, self.changed = wrapper, full, ChangedBuffers()
        fn = wrapper.checkpoint_fn
        self.checkpoint_fn = functools.partial(
            fn.func, *fn.args, **{k: v for k, v in fn.keywords.items() if k != "context_fn"}) if full else fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = self.wrapper._checkpoint_wrapped_module
        if forwards_are_plain():
            return inner(*args, **kwargs)
        function = BufferKeepingFunction(ReplayFunction(self.wrapper, inner), self.wrapper, self.changed)
        return self.checkpoint_fn(function, *args, **kwargs)


class _UnplannedForward:
    """A checkpoint wrapper at a module the plan does not checkpoint: the plan is the program,
    so its inner module runs plainly (no replay the plan did not place)."""

    def __init__(self, wrapper: torch.nn.Module) -> None:
        self.wrapper = wrapper

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapper._checkpoint_wrapped_module(*args, **kwargs)


def _patch(module: torch.nn.Module) -> Any:
    """The forward ``checkpoint_regions`` put on ``module``'s instance, if any."""
    forward = module.__dict__.get("forward")
    return forward if isinstance(forward, (_PlannedForward, _WrappedForward, _UnplannedForward)) else None


def _is_wrapper(module: torch.nn.Module) -> bool:
    return hasattr(module, "checkpoint_fn") or hasattr(module, "_checkpoint_wrapped_module")


def _is_our_wrapper(module: torch.nn.Module) -> bool:
    fn = getattr(module, "checkpoint_fn", None)
    # torch's CheckpointWrapper keeps ``partial(checkpoint_fn, **options)`` (context_fn, ...) on torch 2.x
    return (fn.func if isinstance(fn, functools.partial) else fn) is hpr_checkpoint


def _wrapper_context_fn(module: torch.nn.Module) -> Optional[Callable[[], Any]]:
    """The ``context_fn`` the user gave ``checkpoint_wrapper``, if any."""
    fn = getattr(module, "checkpoint_fn", None)
    return fn.keywords.get("context_fn") if isinstance(fn, functools.partial) else None


def _refuse_compiled_around(region: torch.nn.Module, fqn: str, stage: int) -> None:
    if "_orig_mod" in region._modules:  # torch.compile(module) returns an OptimizedModule around it
        how = f"torch.compile({type(region._orig_mod).__name__}) registered in its place"
    elif getattr(region, "_compiled_call_impl", None) is not None:
        how = "compiled in place by .compile()"
    else:
        return
    raise RunError(f"hp_recompute.pipelining: stage {stage}: region '{fqn}' is {how}, so its compiled call would "
                   f"trace the plan's checkpoint, which has no recompute handle there; wrap the block with "
                   f"hp_recompute.checkpoint_wrapper, then call .compile() on the wrapper: it compiles the block "
                   f"inside the checkpoint (docs/compile-split.md)")


def check_regions(module: torch.nn.Module, fqns: Sequence[str], stage: int,
                  selective: Collection[str] = ()) -> List[torch.nn.Module]:
    """The regions ``fqns`` of ``module``, once every check of ``checkpoint_regions`` holds
    (else ``RunError``); nothing is patched."""
    regions = [_admitted_region(module, fqn, stage, fqn in selective) for fqn in fqns]
    for name, sub in module.named_modules():
        if hf_checkpointing_on(sub):
            raise RunError(f"hp_recompute.pipelining: stage {stage}: module '{name}' has Hugging Face's gradient "
                           f"checkpointing on, which checkpoints its forward again inside the plan's (or where the "
                           f"plan placed no replay); call model.gradient_checkpointing_disable() before building "
                           f"the stages: the plan checkpoints the layers")
        if name not in fqns and _is_wrapper(sub) and not _is_our_wrapper(sub):
            raise RunError(f"hp_recompute.pipelining: stage {stage}: module '{name}' is wrapped by torch's "
                           f"checkpoint, but the plan does not checkpoint it, so it would replay where the plan "
                           f"placed no replay; unwrap it, or convert it with hp_recompute.convert_checkpoint_"
                           f"wrappers(model) (ours run as the plan says)")
    return regions


def checkpoint_regions(module: torch.nn.Module, fqns: Sequence[str], stage: int,
                       selective: Collection[str] = ()) -> List[str]:
    """Makes every region ``fqns`` of stage ``stage``'s ``module`` run through our checkpoint,
    those in ``selective`` with the selective policy (NOTE [ Selective policy ]).

    A region the user wrapped with ``hp_recompute.checkpoint_wrapper`` keeps its wrapper
    and its options (a selective policy's ``context_fn``); it only learns to run its inner
    module plainly inside ``plain_forwards()``. Returns the FQNs it patched (none twice).
    Raises ``RunError`` naming the region when ``module`` has no such submodule, torch's
    checkpoint wraps it, it is compiled around its checkpoint, or its wrapper's ``context_fn``
    disagrees with the plan (none for a selective region: it would keep less than planned and
    replay everything; one that is not a selective policy for a full region: it may keep more;
    a selective policy there is set aside, hpr.selective.plan-full), or a selective region holds
    a module compiled where the policy cannot see its ops; and when torch's checkpoint wraps a
    module the plan does not checkpoint. Our wrappers there run their modules plainly. Every
    check comes before any patch.
    """
    regions = check_regions(module, fqns, stage, selective)
    # Every check passed: now the patches (a refusal above leaves the modules as they were).
    return patch_regions(module, dict(zip(fqns, regions)), selective)


def patch_regions(module: torch.nn.Module, regions: Dict[str, torch.nn.Module],
                  selective: Collection[str] = ()) -> List[str]:
    """The patches of ``checkpoint_regions`` for ``regions`` (FQN -> module) that
    ``check_regions`` admitted: each region's forward is this plan's, and every other
    module's is its own (or, for our wrapper, runs plainly). Idempotent, and cheap when the
    modules have this plan's patches already: a schedule applies its plan before each step,
    so a second schedule over the same stages (another plan) never changes the first's.
    Returns the FQNs it patched anew."""
    context_fn = selective_context_fn() if selective else None
    patched: List[str] = []
    for fqn, region in regions.items():
        policy = context_fn if fqn in selective else None
        forward = _patch(region)
        if isinstance(forward, _UnplannedForward):
            del region.forward  # unplanned by an earlier plan (stages reused), planned by this one
            forward = None
        if isinstance(forward, _PlannedForward):
            if (forward.context_fn is None) != (policy is None):  # an earlier plan's policy
                region.forward = forward.with_policy(policy)
            continue
        full = policy is None and _wrapper_context_fn(region) is not None
        if isinstance(forward, _WrappedForward):
            if forward.full != full:  # an earlier plan's policy
                region.forward = _WrappedForward(region, full)
            continue
        if _is_our_wrapper(region):
            region.forward = _WrappedForward(region, full)
        else:
            original = region.forward
            if is_fsdp_module(region):  # sharded already: a replay gathers its parameters (hpr.fsdp.replay-unsharded)
                original = ReplayFunction(region, original)
            region.forward = _PlannedForward(region, original, policy)
        patched.append(fqn)
    _unplan_other_wrappers(module, regions)
    return patched


def unplanned_blocks(module: torch.nn.Module, regions: Collection[str]) -> List[str]:
    """Blocks of ``module`` the plan's ``regions`` of its stage leave out: the other children
    of each ``ModuleList``/``ModuleDict`` that holds one of the regions, those with
    parameters. A stage module keeps
    only its own blocks (torchtitan deletes the others), so another block there means a plan
    made for another model or another split, whose memory and replays would not hold."""
    names = set(regions)
    containers = {}
    for fqn in regions:
        parent, _, _ = fqn.rpartition(".")
        try:
            container = module.get_submodule(parent) if parent else None
        except AttributeError:  # a segment between regions ("norm+output") or another stage's module
            continue
        if isinstance(container, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            containers[parent] = container
    # A placeholder without parameters (nn.Identity kept to hold the indices) is no block.
    return [f"{parent}.{child}" for parent, container in sorted(containers.items())
            for child, block in container.named_children()
            if f"{parent}.{child}" not in names and any(True for _ in block.parameters())]


def _admitted_region(module: torch.nn.Module, fqn: str, stage: int, selective: bool) -> torch.nn.Module:
    """The region ``fqn`` of ``module``, once every rule it must meet holds (else ``RunError``)."""
    try:
        region = module.get_submodule(fqn)
    except AttributeError:
        raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}', but the "
                       f"stage module ({type(module).__name__}) has no submodule of that name; keep the full "
                       f"model's FQNs in each stage module (as torchtitan does)") from None
    _refuse_compiled_around(region, fqn, stage)
    if _is_wrapper(region) and not _is_our_wrapper(region):
        raise RunError(f"hp_recompute.pipelining: stage {stage}: region '{fqn}' is already wrapped by torch's "
                       f"checkpoint, which replays once per backward call; unwrap it (the plan checkpoints it) "
                       f"or convert it with hp_recompute.convert_checkpoint_wrappers(model) (torchtitan's AC: "
                       f"right after it is applied)")
    if _is_our_wrapper(region) and selective and _wrapper_context_fn(region) is None:
        raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}' "
                       f"\"selective\", but its checkpoint_wrapper has no context_fn, so it would replay "
                       f"every op; unwrap it (the plan checkpoints it) or pass the policy: "
                       f"checkpoint_wrapper(block, context_fn=hp_recompute.selective_context_fn())")
    context_fn = _wrapper_context_fn(region) if _is_our_wrapper(region) else None
    if not selective and context_fn is not None and not is_selective_policy(context_fn):
        raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}' in full, "
                       f"but its checkpoint_wrapper has a context_fn that is not a selective policy (torch's "
                       f"create_selective_checkpoint_contexts), which may keep what the plan did not price; drop "
                       f"the context_fn, or make it a selective policy [hpr.selective.plan-full]")
    hidden = hidden_compiled_modules(region, _wrapper_context_fn(region) or selective_context_fn()) if selective else []
    if hidden:
        names = ", ".join(f"'{fqn}.{h}'" if h else f"'{fqn}'" for h in hidden)
        raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}' "
                       f"\"selective\", but {names} is compiled where the policy cannot see its ops, "
                       f"so the replay would recompute every matmul; compile the block as "
                       f"checkpoint_wrapper(block, context_fn=hp_recompute.selective_context_fn()).compile() "
                       f"(inductor then keeps the ops the policy saves dispatched), or plan the region in full "
                       f"[hpr.selective.visible-ops]")
    return region


def _unplan_other_wrappers(module: torch.nn.Module, fqns: Collection[str]) -> None:
    """A checkpoint wrapper of ours at a module the plan does not checkpoint (a block auto
    chose to keep, a finer wrapper inside a planned block) would replay where the plan placed
    no replay: it runs its inner module plainly (torch's was refused above: it cannot be
    told). A module an earlier plan checkpointed (stages reused) gets its own forward back."""
    for name, sub in module.named_modules():
        if name in fqns:
            continue
        forward = _patch(sub)
        if isinstance(forward, (_PlannedForward, _WrappedForward)):
            del sub.forward  # planned by an earlier plan (stages reused), not by this one
            forward = None
        if _is_our_wrapper(sub) and forward is None:
            sub.forward = _UnplannedForward(sub)
