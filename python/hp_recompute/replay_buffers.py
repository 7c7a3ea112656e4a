"""Replays that leave a module's buffers as its forward left them.

Why: a region that updates buffers in its forward (BatchNorm's running statistics, a
step counter) updates them again in every replay, which a plain step never does; torch's
checkpoint does so too, and outside a plan ours must behave as torch's. Under a plan the
step must compute what the plain model computes, so a runtime checkpoints
``BufferKeepingFunction(fn, module)`` instead of ``fn`` (the runner's units,
``PlannedSchedule``'s regions; docs/runner.md).

Which buffers: those the module's first forward changes, found by value: a kernel that
updates a buffer in place does not always bump its version counter (``native_batch_norm``
leaves ``running_mean``'s alone). A ``BufferKeepingFunction`` is made for one checkpoint
call: its first call is the forward, every later one a replay (ours, or torch's in the
runner's native mode), which saves those buffers and restores them afterwards, also when
the replay stops early. A replay reads the buffers as they are when it runs (a later
microbatch's forward may have changed them), as torch's checkpoint does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Dict, List, Optional

import torch

__all__ = ["BufferKeepingFunction", "ChangedBuffers"]


class ChangedBuffers:
    """The buffers a module's forward changes, per mode (``module.training``): found by the
    first forward in that mode (an eval forward changes no BatchNorm statistic; a training
    one does)."""

    __slots__ = ("by_mode",)

    def __init__(self) -> None:
        self.by_mode: Dict[bool, List[torch.Tensor]] = {}


class BufferKeepingFunction:
    """``fn`` (a module's forward) for one checkpoint call: its replays restore the buffers of
    ``module`` that the forward changes.

    ``changed`` is shared by every call of one module across microbatches and steps (the
    module's first forward finds the buffers). The ``replay_context`` of ``fn``, if any
    (FSDP's unshard, ``fsdp.ReplayFunction``), is its own. Named as ``fn`` in messages.
    """

    __slots__ = ("fn", "module", "changed", "buffers", "__qualname__")

    def __init__(self, fn: Callable[..., Any], module: torch.nn.Module, changed: ChangedBuffers) -> None:
        self.fn, self.module, self.changed = fn, module, changed
        self.buffers: Optional[List[torch.Tensor]] = None  # set by the forward: what its replays restore
        self.__qualname__ = getattr(fn, "__qualname__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.buffers is None:  # the forward
            mode = self.module.training
            known = self.changed.by_mode.get(mode)
            if known is not None:
                self.buffers = known
                return self.fn(*args, **kwargs)
            before = [(b, b.detach().clone()) for b in self.module.buffers()]
            out = self.fn(*args, **kwargs)
            self.buffers = self.changed.by_mode[mode] = [b for b, value in before if not torch.equal(b, value)]
            return out
        saved = [(b, b.detach().clone()) for b in self.buffers]
        try:
            return self.fn(*args, **kwargs)
        finally:  # also when the replay stops early (hpr.session.faithful-replay)
            with torch.no_grad():
                for b, value in saved:
                    b.copy_(value)

    def replay_context(self) -> ContextManager[Any]:
        """What ``fn`` needs around a replay (frame.py), if anything."""
        return getattr(self.fn, "replay_context", contextlib.nullcontext)()
