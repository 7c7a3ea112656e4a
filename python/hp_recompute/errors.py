"""The errors hp_recompute raises for its users, in the package's base layer.

Kept in their own module so that every other module (frames, sessions, the plan reader,
the runtimes, the tools) can raise them without import cycles. Each derives from
``HPRecomputeError``, so ``except hp_recompute.HPRecomputeError`` catches any of them,
and from the builtin error a caller would expect (``RuntimeError``, ...).
"""

from __future__ import annotations

import torch.utils.checkpoint as _torch_checkpoint

__all__ = ["CheckpointError", "HPRecomputeError", "RunError", "TorchCheckpointError", "error_text"]

# torch >= 2.1 raises torch.utils.checkpoint.CheckpointError; deriving from it lets code
# written against torch's checkpoint catch ours unchanged. torch 1.13 has none (its
# checkpoint raises RuntimeError). Raised as is where our checkpoint is torch's (hpr.session.unbound-is-torch).
TorchCheckpointError = getattr(_torch_checkpoint, "CheckpointError", RuntimeError)


class HPRecomputeError(Exception):
    """The root of every error hp_recompute raises for its users; its message starts with
    ``hp_recompute`` and says what to fix."""


class CheckpointError(TorchCheckpointError, HPRecomputeError):
    """A checkpoint or recompute session was used against the rules.

    Every message starts with ``hp_recompute:`` and says how to fix the problem (see
    NOTE [ Recompute sessions ] in ``checkpoint.py``). Where torch's checkpoint raises
    for the same condition outside a session, ours raises torch's own error instead,
    type and text (hpr.session.unbound-is-torch). A RuntimeError, and on torch >= 2.1 a
    ``torch.utils.checkpoint.CheckpointError``.

    On torch 1.13, an error raised inside an autograd hook during ``backward``
    reaches the caller as a plain ``RuntimeError`` whose text contains this
    message (torch converts hook exceptions there); ``recompute_handle`` and
    ``checkpoint`` always raise ``CheckpointError`` itself.
    """


class RunError(RuntimeError, HPRecomputeError):
    """A runtime error; the message starts with ``hp_recompute:`` (``hp_recompute.run:`` from the runner's
    own checks) and says what to fix."""


def error_text(text: str) -> str:
    """Prefix ``text`` so that users can grep for the component that failed."""
    return "hp_recompute: " + text
