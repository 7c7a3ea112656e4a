"""Checkpointing the plan's regions of a torch ``PipelineStage``'s module, in place.

Why in place: torchtitan and FSDP address parameters by their fully qualified names
(``layers.3.attention.wq.weight``); a wrapper module would insert a level into every
one of them. We replace the *instance's* ``forward`` instead (``nn.Module.__call__``
looks it up on the instance first), so the module tree, its parameter names, its
state dict and its hooks stay as they were. The new forward runs the original one
through ``hp_recompute.checkpoint`` (with the selective policy's ``context_fn`` for a region
the plan checkpoints ``"selective"``), or plainly while ``plan.interpreter.plain_forwards()`` is open (a
forward the plan marks ``"checkpoint": false``).

A region that ``fully_shard`` has made an FSDP module is checkpointed inside FSDP's hooks,
as ``checkpoint_wrapper`` before ``fully_shard`` would be, and its replays gather its
parameters as the wrapper's do (``fsdp.ReplayFunction``).

A region already wrapped with ``hp_recompute.checkpoint_wrapper`` keeps its wrapper (and
its options, a selective policy's ``context_fn`` included); one wrapped by torch's own
checkpoint would replay once per backward call, so it is refused with a message rather
than silently replayed twice. A wrapper's own ``context_fn`` must agree with the plan: a
region the plan checkpoints in full refuses one (it would keep what the plan did not price),
a selective one needs one; and a selective region with a module compiled where the policy
cannot see its ops is refused (NOTE [ Selective policy ] Rule 5). A wrapper at a module the
plan does not checkpoint runs its module plainly (ours) or is refused (torch's): the plan
places every replay.

A compiled region must be compiled *inside* its checkpoint, as
``checkpoint_wrapper(block).compile()`` does (Rule 7 of NOTE [ Compiled dx/dw split ]). A
region compiled around it (``torch.compile(block)`` registered in its place, or a plain
block's in-place ``block.compile()``, whose compiled call would trace our checkpoint) has
no recompute handle, so it is refused here, before the first forward.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Collection, List, Optional, Sequence

import torch

from ..checkpoint import checkpoint as hpr_checkpoint
from ..fsdp import ReplayFunction, is_fsdp_module
from ..plan.interpreter import forwards_are_plain
from ..plan.reader import RunError
from ..selective import hidden_compiled_modules, selective_context_fn

__all__ = ["check_regions", "checkpoint_regions", "is_planned_checkpoint", "unplanned_blocks"]

_MARK = "_hp_recompute_planned_forward"


def _planned_forward(original: Any, context_fn: Optional[Callable[[], Any]], *args: Any, **kwargs: Any) -> Any:
    if forwards_are_plain() or not torch.is_grad_enabled():
        return original(*args, **kwargs)
    if context_fn is None:
        return hpr_checkpoint(original, *args, use_reentrant=False, **kwargs)
    return hpr_checkpoint(original, *args, use_reentrant=False, context_fn=context_fn, **kwargs)


def _wrapped_forward(checkpointed: Any, inner: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A region the user wrapped with ``hp_recompute.checkpoint_wrapper``: its wrapper (and
    options: ``context_fn``, ...), or its inner module while forwards are plain."""
    if forwards_are_plain():
        return inner(*args, **kwargs)
    return checkpointed(*args, **kwargs)


def _unplanned_forward(inner: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A checkpoint wrapper at a module the plan does not checkpoint: the plan is the program,
    so its inner module runs plainly (no replay the plan did not place)."""
    return inner(*args, **kwargs)


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


def is_planned_checkpoint(module: torch.nn.Module) -> bool:
    """Whether ``checkpoint_regions`` (or ``hp_recompute.checkpoint_wrapper``) checkpoints ``module``."""
    return getattr(module, _MARK, False) or _is_our_wrapper(module)


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
        if name not in fqns and _is_wrapper(sub) and not _is_our_wrapper(sub):
            raise RunError(f"hp_recompute.pipelining: stage {stage}: module '{name}' is wrapped by torch's "
                           f"checkpoint, but the plan does not checkpoint it, so it would replay where the plan "
                           f"placed no replay; unwrap it, or wrap it with hp_recompute.checkpoint_wrapper (which "
                           f"runs it as the plan says)")
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
    replay everything; one for a full region: it would keep more), or a selective region holds
    a module compiled where the policy cannot see its ops; and when torch's checkpoint wraps a
    module the plan does not checkpoint. Our wrappers there run their modules plainly. Every
    check comes before any patch.
    """
    regions = check_regions(module, fqns, stage, selective)
    # Every check passed: now the patches (a refusal above leaves the modules as they were).
    context_fn = selective_context_fn() if selective else None
    patched: List[str] = []
    for fqn, region in zip(fqns, regions):
        if isinstance(region.__dict__.get("forward"), functools.partial) \
                and region.__dict__["forward"].func is _unplanned_forward:
            del region.forward  # unplanned by an earlier plan (stages reused), planned by this one
        if getattr(region, _MARK, False):
            # Patched for an earlier plan (stages reused by another schedule): this plan's policy.
            forward = region.forward
            if isinstance(forward, functools.partial) and forward.func is _planned_forward:
                region.forward = functools.partial(_planned_forward, forward.args[0],
                                                   context_fn if fqn in selective else None)
            continue
        if _is_our_wrapper(region):
            region.forward = functools.partial(_wrapped_forward, region.forward, region._checkpoint_wrapped_module)
        else:
            original = region.forward
            if is_fsdp_module(region):  # sharded already: a replay gathers its parameters (fsdp.py Rule 6)
                original = ReplayFunction(region, original)
            region.forward = functools.partial(_planned_forward, original, context_fn if fqn in selective else None)
        setattr(region, _MARK, True)
        patched.append(fqn)
    _unplan_other_wrappers(module, fqns)
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
                       f"or wrap it with hp_recompute.checkpoint_wrapper")
    if _is_our_wrapper(region) and selective and _wrapper_context_fn(region) is None:
        raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}' "
                       f"\"selective\", but its checkpoint_wrapper has no context_fn, so it would replay "
                       f"every op; unwrap it (the plan checkpoints it) or pass the policy: "
                       f"checkpoint_wrapper(block, context_fn=hp_recompute.selective_context_fn())")
    if _is_our_wrapper(region) and not selective and _wrapper_context_fn(region) is not None:
        raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}' in full, "
                       f"but its checkpoint_wrapper has a context_fn (its own policy), which keeps what the plan "
                       f"did not price; drop the context_fn, or plan the region \"selective\" (a model with its "
                       f"selective costs)")
    hidden = hidden_compiled_modules(region) if selective else []
    if hidden:
        names = ", ".join(f"'{fqn}.{h}'" if h else f"'{fqn}'" for h in hidden)
        raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}' "
                       f"\"selective\", but {names} is compiled where the policy cannot see its ops "
                       f"(NOTE [ Selective policy ] Rule 5), so the replay would recompute every matmul; "
                       f"compile the block as checkpoint_wrapper(block, context_fn=hp_recompute."
                       f"selective_context_fn()).compile(backend=\"aot_eager\"), or plan the region in full")
    return region


def _unplan_other_wrappers(module: torch.nn.Module, fqns: Collection[str]) -> None:
    """A checkpoint wrapper of ours at a module the plan does not checkpoint (a block auto
    chose to keep, a finer wrapper inside a planned block) would replay where the plan placed
    no replay: it runs its inner module plainly (torch's was refused above: it cannot be
    told). A module an earlier plan checkpointed (stages reused) gets its own forward back."""
    for name, sub in module.named_modules():
        if name in fqns:
            continue
        forward = sub.__dict__.get("forward")
        if isinstance(forward, functools.partial) and forward.func is _planned_forward:
            del sub.forward  # planned by an earlier plan (stages reused), not by this one
            delattr(sub, _MARK)
        if not _is_our_wrapper(sub):
            continue
        forward = sub.__dict__.get("forward")
        if not (isinstance(forward, functools.partial) and forward.func is _unplanned_forward):
            sub.forward = functools.partial(_unplanned_forward, sub._checkpoint_wrapped_module)
        if getattr(sub, _MARK, False):
            delattr(sub, _MARK)
