"""The selective recompute policy: a checkpoint that saves its expensive ops' outputs.

NOTE [ Selective policy ]
=========================
A region's checkpoint is ``none``, ``full`` or ``selective`` (plan and model JSON
``"checkpoint"``: ``false``, ``true`` or ``"selective"``; docs/models.md, "Policies").
Selective is Megatron's ``--recompute-granularity selective`` and torch's selective
activation checkpointing (SAC): the forward saves the outputs of the ops in ``SAVED_OPS``,
and the replay recomputes only the rest. This module implements the rules below;
docs/rules.md states each one and why:

  hpr.selective.saved-ops       ``SAVED_OPS``: the matmul family and the fused attention kernels
  hpr.selective.context-fn      ``selective_context_fn()`` saves exactly those ops
  hpr.selective.priced-as-run   the costs tool measures under the ``context_fn`` that runs
  hpr.selective.supported       torch >= 2.4, else refused before any rank runs
  hpr.selective.visible-ops     the policy sees each call of a saved op, compiled or not
  hpr.selective.plan-full       a region the plan checkpoints in full sets its wrapper's policy aside
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ContextManager, FrozenSet, Iterable, List, Optional, Tuple

import torch
import torch.utils.checkpoint

from .errors import CheckpointError, error_text

__all__ = ["SAVED_OPS", "VISIBLE_OPS", "hidden_compiled_modules", "is_selective_policy", "policy_saved_ops",
           "saved_ops", "selective_context_fn", "selective_supported"]

#: hpr.selective.visible-ops: set by ``checkpoint_wrapper(...).compile()`` on the module it
#: compiles: True when its backend dispatches each aten op, else the frozenset of ops it keeps
#: dispatched (a policy around it sees those).
VISIBLE_OPS = "_hp_recompute_visible_ops"

#: hpr.selective.saved-ops: the default op set, by name (``torch.ops.aten.<name>.default``); names
#: this torch lacks are skipped.
SAVED_OPS: Tuple[str, ...] = (
    "mm", "addmm", "bmm", "baddbmm", "_scaled_mm",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
)


def selective_supported() -> bool:
    """Whether this torch has selective checkpointing (hpr.selective.supported)."""
    return hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts")


def saved_ops(names: Iterable[str] = SAVED_OPS) -> List[Any]:
    """The ``OpOverload`` of every name this torch has (hpr.selective.saved-ops)."""
    ops = []
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.append(packet.default)
    return ops


class _SavedOpsPolicy:
    """``create_selective_checkpoint_contexts``'s policy function: save the outputs of ``ops``,
    recompute every other op (hpr.selective.context-fn); an ``out=`` overload of a saved op is compiled code
    the policy cannot apply to (hpr.selective.visible-ops)."""

    def __init__(self, ops: Iterable[Any]) -> None:
        self.ops = frozenset(ops)
        self.packets = frozenset(op.overloadpacket for op in self.ops)

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        if op in self.ops:
            return CheckpointPolicy.MUST_SAVE
        if getattr(op, "overloadpacket", None) in self.packets and op._schema.is_mutable:
            raise CheckpointError(error_text(
                f"the selective policy sees {op}, an out= call of an op it saves (a compiled kernel's, e.g. "
                f"inductor's extern matmul, or an explicit out=): an output written into the caller's buffer cannot "
                f"be saved, so the replay would recompute it; compile the block with backend=\"aot_eager\", call "
                f"the op without out=, or checkpoint the region in full [hpr.selective.visible-ops]"))
        return CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn(
        names: Optional[Iterable[str]] = None) -> Callable[[], Tuple[ContextManager[Any], ContextManager[Any]]]:
    """The ``context_fn`` that checkpoints selectively (hpr.selective.context-fn): saves the outputs of
    ``names`` (default ``SAVED_OPS``), recomputes the rest; its forward raises ``CheckpointError`` on a
    block compiled to fused kernels (hpr.selective.visible-ops). Raises ``RuntimeError`` on a torch
    without it."""
    if not selective_supported():
        raise RuntimeError(f"hp_recompute: selective recompute needs torch >= 2.4 "
                           f"(torch.utils.checkpoint.create_selective_checkpoint_contexts); this is torch "
                           f"{torch.__version__}")
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return functools.partial(create_selective_checkpoint_contexts,
                             _SavedOpsPolicy(saved_ops(SAVED_OPS if names is None else names)))


def _sac_contexts(context_fn: Callable[[], Any]) -> Tuple[Any, Any]:
    """What ``context_fn`` returns, and its forward context if those are torch's selective
    checkpoint contexts (``create_selective_checkpoint_contexts``), else None."""
    contexts = context_fn()
    if not selective_supported():
        return contexts, None
    from torch.utils.checkpoint import _CachingTorchDispatchMode

    forward = contexts[0] if isinstance(contexts, tuple) and len(contexts) == 2 else None
    return contexts, forward if isinstance(forward, _CachingTorchDispatchMode) else None


def is_selective_policy(context_fn: Callable[[], Any]) -> bool:
    """Whether ``context_fn`` is a selective policy (torch's selective checkpoint contexts): a
    choice of what to save and nothing else, which a plan that checkpoints the region in full
    sets aside (hpr.selective.plan-full)."""
    return _sac_contexts(context_fn)[1] is not None


def _policy_function(context_fn: Callable[[], Any], what: str) -> Callable[..., Any]:
    """The policy function of ``context_fn``'s SAC contexts (hpr.selective.visible-ops), or ``CheckpointError``."""
    contexts, forward = _sac_contexts(context_fn)
    if forward is None:
        raise CheckpointError(error_text(
            f"{what}: its context_fn returns {type(contexts).__name__}, not torch's selective checkpoint contexts "
            f"(create_selective_checkpoint_contexts), so which ops it saves cannot be read off before the block "
            f"compiles; compile with backend=\"aot_eager\" [hpr.selective.visible-ops]"))
    return forward.policy_fn


def policy_saved_ops(context_fn: Callable[[], Any], what: str = "compile") -> FrozenSet[Any]:
    """hpr.selective.visible-ops: the ops (``OpOverload``) the policy of ``context_fn`` saves, asked as in a forward
    about each op the dispatcher knows, twice, without arguments. Raises ``CheckpointError``,
    naming ``what``, for a ``context_fn`` that is not torch's SAC contexts or a policy that
    needs its op's arguments."""
    from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

    policy = _policy_function(context_fn, what)
    saving = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE, True)  # torch reads True as MUST_SAVE
    ctx = SelectiveCheckpointContext(is_recompute=False)
    saved = set()
    for op in _registered_ops():
        try:
            if any([policy(ctx, op) in saving for _ in range(2)]):  # a list: both calls, so a counter's parity holds
                saved.add(op)
        except Exception as e:
            raise CheckpointError(error_text(
                f"{what}: its selective policy raised {type(e).__name__} ({e}) when asked about {op} without "
                f"arguments; a policy that reads its op's arguments cannot say before the block compiles which ops "
                f"inductor must leave dispatched; compile with backend=\"aot_eager\" "
                f"[hpr.selective.visible-ops]")) from None
    return frozenset(saved)


def _registered_ops() -> Tuple[Any, ...]:
    """Every functional ``OpOverload`` the dispatcher knows (an ``out=`` overload writes into its
    caller's buffer, which no policy can save)."""
    return _functional_ops(tuple(sorted(torch._C._dispatch_get_all_op_names())))


@functools.lru_cache(maxsize=4)
def _functional_ops(names: Tuple[str, ...]) -> Tuple[Any, ...]:
    found = []
    for name in names:
        namespace, _, rest = name.partition("::")
        op, _, overload = rest.partition(".")
        try:
            overload_of = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
        except (AttributeError, RuntimeError):  # registered without a Python binding here
            continue
        if isinstance(overload_of, torch._ops.OpOverload) and not overload_of._schema.is_mutable:
            found.append(overload_of)
    return tuple(found)


def hidden_compiled_modules(module: torch.nn.Module, context_fn: Callable[[], Any]) -> List[str]:
    """hpr.selective.visible-ops: the names (``""`` for ``module`` itself) of the compiled modules in ``module``
    that hide an op the policy of ``context_fn`` saves: compiled other than by a checkpoint
    wrapper's ``compile()`` with a backend that dispatches each aten op or the ops it saves."""
    hidden: List[str] = []
    saved: Optional[FrozenSet[Any]] = None
    for name, sub in module.named_modules():
        compiled = "_orig_mod" in sub._modules or getattr(sub, "_compiled_call_impl", None) is not None
        visible = getattr(sub, VISIBLE_OPS, None)  # None: compiled otherwise, no op known visible
        if not compiled or visible is True:
            continue
        if visible is not None and saved is None:
            saved = policy_saved_ops(context_fn, f"module '{name}'")
        if visible is None or not saved <= visible:
            hidden.append(name)
    return hidden
