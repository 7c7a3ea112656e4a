"""The selective recompute policy: a checkpoint that saves its expensive ops' outputs.

NOTE [ Selective policy ]

A region's checkpoint is ``none``, ``full`` or ``selective`` (plan and model JSON
``"checkpoint"``: ``false``, ``true`` or ``"selective"``; docs/models.md, "Policies").
Selective is Megatron's ``--recompute-granularity selective`` and torch's selective
activation checkpointing (SAC): the forward saves the outputs of the ops in ``SAVED_OPS``,
and the replay recomputes only the rest, reading those outputs back.

1. ``SAVED_OPS`` is the default op set: the matmul family (``mm``, ``addmm``, ``bmm``,
   ``baddbmm``, ``_scaled_mm``; ``linear`` and ``matmul`` reach the dispatcher as these)
   and the fused attention kernels (flash, memory-efficient, cuDNN, the CPU flash
   kernel). They hold most of a transformer block's FLOPs and a minority of its saved
   bytes, so saving them makes the replay cheap at a fraction of no-checkpoint memory.
2. ``selective_context_fn()`` is the ``context_fn`` of ``hp_recompute.checkpoint`` that
   applies it: torch's ``create_selective_checkpoint_contexts`` with the op set as a list
   (listed ops must be saved, every other op prefers recompute). A session replays such a
   region once, like any other (sessions, prefetch, retain and clear are unchanged).
3. The costs tool measures a region under this same ``context_fn``
   (``selective_*`` fields), so the planned memory and time are those of what runs. A
   user's own op set goes through ``checkpoint_wrapper(block, context_fn=...)``, which
   the runtimes keep as it is; the planner then prices it as the plan's policy says.
4. torch before 2.4 has no ``create_selective_checkpoint_contexts``: a plan with a
   selective region is refused there before any rank runs (``plan.reader.build_plan``),
   and the costs tool writes no ``selective_*`` field.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ContextManager, Iterable, List, Optional, Tuple

import torch
import torch.utils.checkpoint

__all__ = ["SAVED_OPS", "saved_ops", "selective_context_fn", "selective_supported"]

#: Rule 1: the default op set, by name (``torch.ops.aten.<name>.default``); names this torch
#: lacks are skipped.
SAVED_OPS: Tuple[str, ...] = (
    "mm", "addmm", "bmm", "baddbmm", "_scaled_mm",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
)


def selective_supported() -> bool:
    """Whether this torch has selective checkpointing (Rule 4)."""
    return hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts")


def saved_ops(names: Iterable[str] = SAVED_OPS) -> List[Any]:
    """The ``OpOverload`` of every name this torch has (Rule 1)."""
    ops = []
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.append(packet.default)
    return ops


def selective_context_fn(
        names: Optional[Iterable[str]] = None) -> Callable[[], Tuple[ContextManager[Any], ContextManager[Any]]]:
    """The ``context_fn`` that checkpoints selectively (Rule 2): saves the outputs of ``names``
    (default ``SAVED_OPS``), recomputes the rest. Raises ``RuntimeError`` on a torch without it."""
    if not selective_supported():
        raise RuntimeError(f"hp_recompute: selective recompute needs torch >= 2.4 "
                           f"(torch.utils.checkpoint.create_selective_checkpoint_contexts); this is torch "
                           f"{torch.__version__}")
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return functools.partial(create_selective_checkpoint_contexts, saved_ops(SAVED_OPS if names is None else names))
