"""``checkpoint_wrapper``: a module whose every forward runs through ``hp_recompute.checkpoint``.

torch's own ``CheckpointWrapper`` (``torch.distributed.algorithms._checkpoint``) does the
module part: it keeps the wrapped module's parameter and state-dict names (torchtitan
and FSDP rely on those FQNs) and forwards ``*args, **kwargs``. We hand it our checkpoint
as its ``checkpoint_fn``, so wrapped modules take part in collectors and sessions.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, FrozenSet, List, Tuple

import torch

from .checkpoint import checkpoint
from .compile_split import SUPPORTED, dispatches_each_op, split_compile_kwargs
from .errors import CheckpointError, error_text
from .fsdp import ReplayFunction
from .selective import VISIBLE_OPS, policy_saved_ops

__all__ = ["checkpoint_wrapper", "convert_checkpoint_wrappers"]

if torch.distributed.is_available():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper as _TorchWrapper

    class CheckpointWrapper(_TorchWrapper):
        """torch's ``CheckpointWrapper``, checkpointing a ``ReplayFunction`` of the wrapped module.

        A prefetched replay of a wrapper that ``fully_shard`` has made an FSDP module then
        runs on unsharded parameters (hpr.fsdp.replay-unsharded, NOTE in
        ``fsdp.py``); without FSDP the function is the module itself. Same class name, so
        ``fully_shard`` calls it ``FSDPCheckpointWrapper``, as torch's.
        """

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.checkpoint_fn(ReplayFunction(self, self._checkpoint_wrapped_module), *args, **kwargs)

        def compile(self, *args: Any, **kwargs: Any) -> None:
            """Compiles the wrapped module in place, inside the checkpoint (hpr.compiled-split.wrapper-compile):
            the checkpoint stays eager, so the block keeps its handles, sessions and prefetch, and its
            backward splits into I and W.

            ``torch.compile``'s keywords; backend ``"inductor"`` (the default) or
            ``"aot_eager"`` is made ``compile_backend(backend)`` on torch >= 2.13. A wrapper
            with a ``context_fn`` (a selective policy) compiles with ``"aot_eager"``, which
            dispatches each aten op, or ``"inductor"``, which keeps the ops its policy saves
            dispatched (hpr.selective.visible-ops); any other backend is refused there.
            """
            if not hasattr(torch, "compile"):
                raise CheckpointError(error_text(f"compile: torch {torch.__version__} has no torch.compile"))
            if args:
                raise TypeError(error_text("compile: torch.compile's options are keyword-only"))
            backend = kwargs.get("backend", "inductor")
            fn = self.checkpoint_fn
            context_fn = fn.keywords.get("context_fn") if isinstance(fn, functools.partial) else None
            visible = dispatches_each_op(backend)
            saved: FrozenSet[Any] = frozenset()
            if context_fn is not None and not visible:
                if not (SUPPORTED and backend == "inductor"):
                    raise CheckpointError(error_text(
                        f"compile: this checkpoint_wrapper has a context_fn (e.g. a selective policy), whose dispatch "
                        f"modes see the aten ops its block dispatches; backend {backend!r} compiles the block to fused "
                        f"kernels they cannot see into, so a policy would save nothing and the replay would recompute "
                        f"every matmul; compile with backend=\"inductor\" (torch >= 2.13: it keeps the ops the "
                        f"policy saves dispatched) or \"aot_eager\", or drop the context_fn to checkpoint in full "
                        f"[hpr.selective.visible-ops]"))
                saved = policy_saved_ops(context_fn)
            inner = self._checkpoint_wrapped_module
            inner.compile(**split_compile_kwargs(kwargs, saved))
            setattr(inner, VISIBLE_OPS, True if visible else saved)


def convert_checkpoint_wrappers(module: torch.nn.Module) -> List[str]:
    """Makes each of torch's own checkpoint wrappers in ``module`` (torchtitan's full or
    selective AC: ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``) one of
    ours, in place: the same module, names and options (``context_fn``,
    ``preserve_rng_state``, ``determinism_check``, ``debug``, ``early_stop``), checkpointing
    through ``hp_recompute.checkpoint``, so ``PlannedSchedule`` can run it as its plan says.
    Call it where torchtitan's AC was applied, before ``fully_shard`` and ``.compile()``.
    Returns the FQNs converted (ours are left as they are).

    Raises ``CheckpointError`` naming the module, before converting any, for a wrapper that
    is reentrant (``CheckpointImpl.REENTRANT``: other semantics), checkpoints through another
    function, or is sharded or compiled already.
    """
    if not torch.distributed.is_available():
        raise CheckpointError(error_text("convert_checkpoint_wrappers needs a torch built with torch.distributed"))
    found: List[Tuple[str, torch.nn.Module, Dict[str, Any]]] = []
    for name, sub in module.named_modules():
        if not isinstance(sub, _TorchWrapper) or isinstance(sub, CheckpointWrapper):
            continue
        fn = sub.checkpoint_fn
        where = f"convert_checkpoint_wrappers: module '{name}'"
        if not isinstance(fn, functools.partial) or fn.func is not torch.utils.checkpoint.checkpoint:
            raise CheckpointError(error_text(f"{where} checkpoints through {getattr(fn, 'func', fn)!r}, not torch's "
                                             f"checkpoint; wrap its block with hp_recompute.checkpoint_wrapper"))
        if fn.keywords.get("use_reentrant") is not False:
            raise CheckpointError(error_text(f"{where} is torch's reentrant checkpoint (CheckpointImpl.REENTRANT), "
                                             f"whose semantics hp_recompute.checkpoint does not have; wrap with "
                                             f"CheckpointImpl.NO_REENTRANT (torch's default)"))
        if type(sub) is not _TorchWrapper:
            raise CheckpointError(error_text(f"{where} is a {type(sub).__name__} (sharded by fully_shard, or another "
                                             f"subclass); convert before fully_shard, right after the AC is applied"))
        if getattr(sub, "_compiled_call_impl", None) is not None:
            raise CheckpointError(error_text(f"{where} is compiled around its checkpoint already; convert before "
                                             f".compile()"))
        found.append((name, sub, {k: v for k, v in fn.keywords.items() if k != "use_reentrant"}))
    for _, sub, options in found:  # every check passed
        sub.__class__ = CheckpointWrapper  # a subclass with torch's layout: the same attributes
        sub.checkpoint_fn = functools.partial(checkpoint, **options)
    return [name for name, _, _ in found]


def checkpoint_wrapper(module: torch.nn.Module, **checkpoint_kwargs: Any) -> torch.nn.Module:
    """Wrap ``module`` so that its forward is ``hp_recompute.checkpoint(module, *args, **kwargs)``.

    Args:
        module: the block to checkpoint (e.g. one transformer layer).
        **checkpoint_kwargs: options of ``checkpoint`` (``context_fn``,
            ``preserve_rng_state``, ``determinism_check``, ``debug``, ``early_stop``).

    Returns:
        a ``CheckpointWrapper`` (torch's, subclassed) around ``module``: same parameter and
        state-dict names as ``module``. ``fully_shard`` may wrap it afterwards
        (torchtitan's order); a prefetch then unshards it for the replay (hpr.fsdp.replay-unsharded).

    Example:
        >>> model.layers[3] = checkpoint_wrapper(model.layers[3])
    """
    if not torch.distributed.is_available():
        raise CheckpointError(error_text("checkpoint_wrapper needs a torch built with torch.distributed"))
    # Keywords only: the positional parameters differ between torch 1.13 and 2.x.
    return CheckpointWrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, checkpoint_fn=checkpoint,
                             **checkpoint_kwargs)
