"""``checkpoint_wrapper``: a module whose every forward runs through ``hp_recompute.checkpoint``.

torch's own ``CheckpointWrapper`` (``torch.distributed.algorithms._checkpoint``) does the
module part: it keeps the wrapped module's parameter and state-dict names (torchtitan
and FSDP rely on those FQNs) and forwards ``*args, **kwargs``. We hand it our checkpoint
as its ``checkpoint_fn``, so wrapped modules take part in collectors and sessions.
"""

from __future__ import annotations

from typing import Any

import torch

from .checkpoint import checkpoint
from .errors import CheckpointError, error_text

__all__ = ["checkpoint_wrapper"]


def checkpoint_wrapper(module: torch.nn.Module, **checkpoint_kwargs: Any) -> torch.nn.Module:
    """Wrap ``module`` so that its forward is ``hp_recompute.checkpoint(module, *args, **kwargs)``.

    Args:
        module: the block to checkpoint (e.g. one transformer layer).
        **checkpoint_kwargs: options of ``checkpoint`` (``context_fn``,
            ``preserve_rng_state``, ``determinism_check``, ``debug``, ``early_stop``).

    Returns:
        torch's ``CheckpointWrapper`` around ``module``: same parameter and state-dict
        names as ``module``.

    Example:
        >>> model.layers[3] = checkpoint_wrapper(model.layers[3])
    """
    if not torch.distributed.is_available():
        raise CheckpointError(error_text("checkpoint_wrapper needs a torch built with torch.distributed"))
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, CheckpointWrapper

    # Keywords only: the positional parameters differ between torch 1.13 and 2.x.
    return CheckpointWrapper(
        module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, checkpoint_fn=checkpoint, **checkpoint_kwargs
    )
