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
than silently replayed twice.

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
from ..selective import selective_context_fn

__all__ = ["checkpoint_regions", "is_planned_checkpoint"]

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


def checkpoint_regions(module: torch.nn.Module, fqns: Sequence[str], stage: int,
                       selective: Collection[str] = ()) -> List[str]:
    """Makes every region ``fqns`` of stage ``stage``'s ``module`` run through our checkpoint,
    those in ``selective`` with the selective policy (NOTE [ Selective policy ]).

    A region the user wrapped with ``hp_recompute.checkpoint_wrapper`` keeps its wrapper
    and its options (a selective policy's ``context_fn``); it only learns to run its inner
    module plainly inside ``plain_forwards()``. Returns the FQNs it patched (none twice).
    Raises ``RunError`` naming the region when ``module`` has no such submodule, torch's
    checkpoint wraps it, or the plan checkpoints it selectively and its wrapper has no
    ``context_fn`` (it would keep less than planned and replay everything).
    """
    context_fn = selective_context_fn() if selective else None
    patched: List[str] = []
    for fqn in fqns:
        try:
            region = module.get_submodule(fqn)
        except AttributeError:
            raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}', but the "
                           f"stage module ({type(module).__name__}) has no submodule of that name; keep the full "
                           f"model's FQNs in each stage module (as torchtitan does)") from None
        if _is_our_wrapper(region) and fqn in selective and _wrapper_context_fn(region) is None:
            raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}' "
                           f"\"selective\", but its checkpoint_wrapper has no context_fn, so it would replay "
                           f"every op; unwrap it (the plan checkpoints it) or pass the policy: "
                           f"checkpoint_wrapper(block, context_fn=hp_recompute.selective_context_fn())")
        if getattr(region, _MARK, False):
            # Patched for an earlier plan (stages reused by another schedule): this plan's policy.
            forward = region.forward
            if isinstance(forward, functools.partial) and forward.func is _planned_forward:
                region.forward = functools.partial(_planned_forward, forward.args[0],
                                                   context_fn if fqn in selective else None)
            continue
        _refuse_compiled_around(region, fqn, stage)
        if _is_our_wrapper(region):
            region.forward = functools.partial(_wrapped_forward, region.forward, region._checkpoint_wrapped_module)
        elif hasattr(region, "checkpoint_fn") or hasattr(region, "_checkpoint_wrapped_module"):
            raise RunError(f"hp_recompute.pipelining: stage {stage}: region '{fqn}' is already wrapped by torch's "
                           f"checkpoint, which replays once per backward call; unwrap it (the plan checkpoints it) "
                           f"or wrap it with hp_recompute.checkpoint_wrapper")
        else:
            original = region.forward
            if is_fsdp_module(region):  # sharded already: a replay gathers its parameters (fsdp.py Rule 6)
                original = ReplayFunction(region, original)
            region.forward = functools.partial(_planned_forward, original, context_fn if fqn in selective else None)
        setattr(region, _MARK, True)
        patched.append(fqn)
    return patched
