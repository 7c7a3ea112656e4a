"""Checkpointing the plan's regions of a torch ``PipelineStage``'s module, in place.

Why in place: torchtitan and FSDP address parameters by their fully qualified names
(``layers.3.attention.wq.weight``); a wrapper module would insert a level into every
one of them. We replace the *instance's* ``forward`` instead (``nn.Module.__call__``
looks it up on the instance first), so the module tree, its parameter names, its
state dict and its hooks stay as they were. The new forward runs the original one
through ``hp_recompute.checkpoint``, or plainly while ``plain_forwards()`` is open (a
forward the plan marks ``"checkpoint": false``).

A region already wrapped with ``hp_recompute.checkpoint_wrapper`` is used as it is;
one wrapped by torch's own checkpoint would replay once per backward call, so it is
refused with a message rather than silently replayed twice.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Iterator, List, Sequence

import torch

from ..checkpoint import checkpoint as hpr_checkpoint
from ..plan.reader import RunError

__all__ = ["checkpoint_regions", "plain_forwards", "is_planned_checkpoint"]

_PLAIN = contextvars.ContextVar("hp_recompute_pipelining_plain", default=False)
_MARK = "_hp_recompute_planned_forward"


@contextlib.contextmanager
def plain_forwards() -> Iterator[None]:
    """Inside, planned checkpoints run their module plainly (saving its activations)."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def _planned_forward(original: Any, *args: Any, **kwargs: Any) -> Any:
    if _PLAIN.get() or not torch.is_grad_enabled():
        return original(*args, **kwargs)
    return hpr_checkpoint(original, *args, use_reentrant=False, **kwargs)


def is_planned_checkpoint(module: torch.nn.Module) -> bool:
    """Whether ``checkpoint_regions`` (or ``hp_recompute.checkpoint_wrapper``) checkpoints ``module``."""
    if getattr(module, _MARK, False):
        return True
    return getattr(module, "checkpoint_fn", None) is hpr_checkpoint


def checkpoint_regions(module: torch.nn.Module, fqns: Sequence[str], stage: int) -> List[str]:
    """Makes every region ``fqns`` of stage ``stage``'s ``module`` run through our checkpoint.

    Returns the FQNs it patched (those already ours are left alone). Raises ``RunError``
    naming the region when ``module`` has no such submodule or torch's checkpoint wraps it.
    """
    patched: List[str] = []
    for fqn in fqns:
        try:
            region = module.get_submodule(fqn)
        except AttributeError:
            raise RunError(f"hp_recompute.pipelining: stage {stage}: the plan checkpoints region '{fqn}', but the "
                           f"stage module ({type(module).__name__}) has no submodule of that name; keep the full "
                           f"model's FQNs in each stage module (as torchtitan does)") from None
        if is_planned_checkpoint(region):
            continue
        if hasattr(region, "checkpoint_fn") or hasattr(region, "_checkpoint_wrapped_module"):
            raise RunError(f"hp_recompute.pipelining: stage {stage}: region '{fqn}' is already wrapped by torch's "
                           f"checkpoint, which replays once per backward call; unwrap it (the plan checkpoints it) "
                           f"or wrap it with hp_recompute.checkpoint_wrapper")
        region.forward = functools.partial(_planned_forward, region.forward)
        setattr(region, _MARK, True)
        patched.append(fqn)
    return patched
