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
   applies it: torch's ``create_selective_checkpoint_contexts`` with a policy function that
   saves exactly the listed ops (must save) and recomputes every other op (prefers
   recompute), as torch's list form does, plus Rule 5's check. A session replays such a
   region once, like any other (sessions, prefetch, retain and clear are unchanged).
3. The costs tool measures a region under this same ``context_fn``
   (``selective_*`` fields), so the planned memory and time are those of what runs. A
   user's own op set goes through ``checkpoint_wrapper(block, context_fn=...)``, which
   the runtimes keep as it is where the plan says selective (priced as this policy's
   measured costs) and refuse where the plan says full (it would keep what the plan did
   not price).
4. torch before 2.4 has no ``create_selective_checkpoint_contexts``: a plan with a
   selective region is refused there before any rank runs (``plan.reader.build_plan``),
   and the costs tool writes no ``selective_*`` field.
5. The policy sees the aten ops the region dispatches, one by one. aot_eager dispatches each
   of them; inductor runs fused kernels instead: other ops vanish into fused loops, and a
   matmul becomes an ``out=`` call into a buffer the kernel owns, which the next kernel may
   overwrite in place. No policy can save such an output, so the replay would recompute
   every matmul while the plan prices a selective one. Hence:
   - ``policy_saved_ops(context_fn)`` reads off which ops a policy saves: torch's SAC
     contexts' policy function is asked, as in a forward, about every op the dispatcher
     knows, twice (a policy counting its calls, as torchtitan's saves every other ``mm``),
     without arguments; the ops it saves at least once. A ``context_fn`` that is not torch's
     SAC contexts, or a policy that reads its op's arguments, is refused (``CheckpointError``).
   - A block compiled with ``compile_backend("inductor", saved_ops=...)`` (so
     ``checkpoint_wrapper(block, context_fn=...).compile()`` compiles it) keeps each call of
     those ops dispatched in its forward: the eager kernel, returning its own output, and no
     kernel of that forward writes into a buffer another one returned (NOTE [ Compiled dx/dw
     split ] Rule 8). The policy's mode then sees and caches each saved output as around
     an eager block, and the replay reads it back. The compiled module is marked with what
     it dispatches (``VISIBLE_OPS``: True where the backend dispatches each op, else that set).
   - The runtimes refuse a region the plan checkpoints selectively when a compiled module in
     it hides an op its policy saves (``hidden_compiled_modules``), before any rank runs.
   - ``selective_context_fn()``'s policy raises ``CheckpointError`` at the first ``out=`` call
     of a saved op, in the forward, before any gradient exists (an explicit ``out=`` in eager
     code too, whose output the policy cannot save either: call the op without ``out=``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ContextManager, FrozenSet, Iterable, List, Optional, Tuple

import torch
import torch.utils.checkpoint

from .errors import CheckpointError, error_text

__all__ = ["SAVED_OPS", "VISIBLE_OPS", "hidden_compiled_modules", "policy_saved_ops", "saved_ops",
           "selective_context_fn", "selective_supported"]

#: Rule 5: set by ``checkpoint_wrapper(...).compile()`` on the module it compiles: True when its
#: backend dispatches each aten op, else the frozenset of ops it keeps dispatched (a policy
#: around it sees those).
VISIBLE_OPS = "_hp_recompute_visible_ops"

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


class _SavedOpsPolicy:
    """``create_selective_checkpoint_contexts``'s policy function: save the outputs of ``ops``,
    recompute every other op (Rule 2); an ``out=`` overload of a saved op is compiled code
    the policy cannot apply to (Rule 5)."""

    def __init__(self, ops: Iterable[Any]) -> None:
        self.ops = frozenset(ops)
        self.packets = frozenset(op.overloadpacket for op in self.ops)

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import CheckpointPolicy

        if op in self.ops:
            return CheckpointPolicy.MUST_SAVE
        if getattr(op, "overloadpacket", None) in self.packets and op._schema.is_mutable:
            raise CheckpointError(error_text(
                f"the selective policy (NOTE [ Selective policy ] Rule 5) sees {op}, an out= call of an op it saves "
                f"(a compiled kernel's, e.g. inductor's extern matmul, or an explicit out=): an output written into "
                f"the caller's buffer cannot be saved, so the replay would recompute it; compile the block with "
                f"backend=\"aot_eager\", call the op without out=, or checkpoint the region in full"))
        return CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn(
        names: Optional[Iterable[str]] = None) -> Callable[[], Tuple[ContextManager[Any], ContextManager[Any]]]:
    """The ``context_fn`` that checkpoints selectively (Rule 2): saves the outputs of ``names``
    (default ``SAVED_OPS``), recomputes the rest; its forward raises ``CheckpointError`` on
    a block compiled to fused kernels (Rule 5). Raises ``RuntimeError`` on a torch without it."""
    if not selective_supported():
        raise RuntimeError(f"hp_recompute: selective recompute needs torch >= 2.4 "
                           f"(torch.utils.checkpoint.create_selective_checkpoint_contexts); this is torch "
                           f"{torch.__version__}")
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return functools.partial(create_selective_checkpoint_contexts,
                             _SavedOpsPolicy(saved_ops(SAVED_OPS if names is None else names)))


def _policy_function(context_fn: Callable[[], Any], what: str) -> Callable[..., Any]:
    """The policy function of ``context_fn``'s SAC contexts (Rule 5), or ``CheckpointError``."""
    from torch.utils.checkpoint import _CachingTorchDispatchMode

    contexts = context_fn()
    forward = contexts[0] if isinstance(contexts, tuple) and len(contexts) == 2 else None
    if not isinstance(forward, _CachingTorchDispatchMode):
        raise CheckpointError(error_text(
            f"{what}: its context_fn returns {type(contexts).__name__}, not torch's selective checkpoint contexts "
            f"(create_selective_checkpoint_contexts), so which ops it saves cannot be read off before the block "
            f"compiles (NOTE [ Selective policy ] Rule 5); compile with backend=\"aot_eager\""))
    return forward.policy_fn


def policy_saved_ops(context_fn: Callable[[], Any], what: str = "compile") -> FrozenSet[Any]:
    """Rule 5: the ops (``OpOverload``) the policy of ``context_fn`` saves, asked as in a forward
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
                f"inductor must leave dispatched (NOTE [ Selective policy ] Rule 5); compile with "
                f"backend=\"aot_eager\"")) from None
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
    """Rule 5: the names (``""`` for ``module`` itself) of the compiled modules in ``module``
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
