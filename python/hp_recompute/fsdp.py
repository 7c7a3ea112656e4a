"""The dx/dw split and prefetched replays on modules wrapped with FSDP2 (``fully_shard``), HSDP included.

NOTE [ FSDP2 and the dx/dw split ]
==================================
FSDP2 drives itself from autograd hooks of one ``loss.backward()`` (unshard before a
module's backward, reshard and reduce-scatter after it, a final callback); the split's I
and W, and a replay prefetched outside any backward, break each of them. This module
makes ``backward_input`` / ``backward_weight`` on a ``fully_shard``-ed module give what
``loss.backward()`` gives, by the rules below; docs/rules.md states each one and why:

  hpr.fsdp.module-weights     the module as the weights: FSDP's unsharded parameters
  hpr.fsdp.open-step          the first I opens a step: no sync until ``reduce_gradients``
  hpr.fsdp.hold-parameters    ``begin_step(hold_parameters=True)``: the caller owns the gathers
  hpr.fsdp.dx-hooks           I runs FSDP's hooks and reduces nothing
  hpr.fsdp.dw-accumulates     W unshards, accumulates as AccumulateGrad does, reshards
  hpr.fsdp.reduce-once        ``reduce_gradients`` after the last W reduces once
  hpr.fsdp.replay-unsharded   a prefetched replay runs on unsharded parameters
  hpr.fsdp.supported          FSDP2 (torch >= 2.6); its internals read in one checked place
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .errors import CheckpointError, error_text

__all__ = ["begin_step", "discard_step", "holds_parameters", "is_fsdp_module", "reduce_gradients", "fsdp_available",
           "FSDP_AVAILABLE"]


@functools.lru_cache(maxsize=None)
def _load_fsdp() -> Tuple[Any, Any]:
    """torch's ``FSDPModule`` and ``fully_shard``, (None, None) without FSDP2; imported on
    first use: ``torch.distributed.fsdp`` is a third of ``import hp_recompute`` otherwise."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except Exception:  # noqa: BLE001 -- ImportError; torch 1.13 under Python 3.11 raises ValueError
        return None, None
    return FSDPModule, fully_shard


def fsdp_available() -> bool:
    """Whether this torch has FSDP2 (hpr.fsdp.supported)."""
    return _load_fsdp()[0] is not None


def __getattr__(name: str) -> Any:
    if name == "FSDP_AVAILABLE":  # the module constant, read lazily (PEP 562)
        return fsdp_available()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fsdp_imported() -> bool:
    """Whether ``torch.distributed.fsdp`` was imported: before, no module can be an
    ``FSDPModule`` (``fully_shard`` lives there), so nothing needs loading it."""
    return "torch.distributed.fsdp" in sys.modules


def is_fsdp_module(module: Any) -> bool:
    """Whether ``module`` is an ``FSDPModule`` (always False without FSDP2)."""
    if not _fsdp_imported():
        return False
    fsdp_module = _load_fsdp()[0]
    return fsdp_module is not None and isinstance(module, fsdp_module)


def _need_fsdp(what: str) -> None:
    if not fsdp_available():
        raise CheckpointError(
            error_text(
                f"{what}: torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard, "
                "torch >= 2.6); there is nothing to reduce [hpr.fsdp.supported]"
            )
        )


# ---------------------------------------------------------------------------------------
# FSDP internals, in one place (hpr.fsdp.supported)
# ---------------------------------------------------------------------------------------


class _Internals:
    """Every read of FSDP2 state that has no public API; checked against the installed torch."""

    checked = False

    @classmethod
    def check(cls, module: Any) -> None:
        if cls.checked:
            return
        state = cls.state(module)
        missing = [n for n in ("_root_post_backward_final_callback", "_state_ctx") if not hasattr(state, n)]
        for group in cls.groups(state):
            missing += [n for n in ("post_backward", "fsdp_params", "reduce_grads", "all_reduce_grads",
                                    "reshard_after_backward", "post_forward_mesh_info", "is_unsharded")
                        if not hasattr(group, n)]
            for fp in group.fsdp_params:
                missing += [n for n in ("sharded_param",) if not hasattr(fp, n)]
                break
        if missing:
            raise CheckpointError(
                error_text(
                    f"the FSDP2 of torch {torch.__version__} lacks {', '.join(sorted(set(missing)))}, which "
                    "hp_recompute.fsdp drives the split with; use a plain backward() for FSDP modules on this "
                    "torch [hpr.fsdp.supported]"
                )
            )
        cls.checked = True

    @staticmethod
    def state(module: Any) -> Any:
        return _load_fsdp()[1].state(module)

    @staticmethod
    def groups(state: Any) -> List[Any]:
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch < 2.10: one group per state
            group = getattr(state, "_fsdp_param_group", None)
            groups = [] if group is None else [group]
        return list(groups)

    @staticmethod
    def unsharded(fp: Any) -> Optional[torch.Tensor]:
        """The tensor the forward used (exists after the first all-gather)."""
        return getattr(fp, "_unsharded_param", None)

    @staticmethod
    def accumulate(fp: Any, grad: torch.Tensor) -> None:
        """What AccumulateGrad, then FSDP's post-backward without sync, do with ``grad``
        (hpr.fsdp.dw-accumulates)."""
        param = fp._unsharded_param
        with torch.no_grad():
            if param.grad is None:
                param.grad = grad.detach().clone()
            else:
                param.grad += grad
        for name in ("accumulate_unsharded_grad_if_needed", "to_accumulated_grad_if_needed"):
            fn = getattr(fp, name, None)
            if fn is not None:
                fn()

    @staticmethod
    def has_grad(fp: Any) -> bool:
        param = getattr(fp, "_unsharded_param", None)
        return (param is not None and param.grad is not None) or getattr(fp, "unsharded_accumulated_grad",
                                                                         None) is not None

    @staticmethod
    def drop_grad(fp: Any) -> None:
        param = getattr(fp, "_unsharded_param", None)
        if param is not None:
            param.grad = None
        if getattr(fp, "unsharded_accumulated_grad", None) is not None:
            fp.unsharded_accumulated_grad = None


def _fsdp_modules(module: torch.nn.Module) -> List[Any]:
    return [m for m in module.modules() if is_fsdp_module(m)]


# ---------------------------------------------------------------------------------------
# Steps (hpr.fsdp.open-step, hpr.fsdp.hold-parameters, hpr.fsdp.reduce-once)
# ---------------------------------------------------------------------------------------


@dataclass
class _Step:
    """One open step of a module: the FSDP modules in it and the settings it changed (hpr.fsdp.open-step,
    hpr.fsdp.hold-parameters)."""

    module_name: str
    fsdp_modules: List[Any]
    saved_sync: List[Tuple[Any, bool, bool]] = field(default_factory=list)  # (group, reduce, all_reduce)
    saved_last: List[Tuple[Any, bool]] = field(default_factory=list)  # (state context, is_last_backward)
    pending: Dict[int, List[str]] = field(default_factory=dict)  # I without W yet: id -> weight names
    closed: bool = False
    # hold_parameters (hpr.fsdp.hold-parameters): (group, reshard_after_backward, post_forward_mesh_info) before
    # the step
    saved_reshard: Optional[List[Tuple[Any, bool, Any]]] = None


_STEPS: "weakref.WeakKeyDictionary[torch.nn.Module, _Step]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _open_step(module: torch.nn.Module, fsdp_modules: List[Any]) -> _Step:
    with _LOCK:
        step = _STEPS.get(module)
        if step is not None:
            return step
        states = [_Internals.state(m) for m in fsdp_modules]
        if any(getattr(st, "_is_root", True) is None for st in states):
            raise CheckpointError(
                error_text(
                    f"{type(module).__name__}: FSDP has not initialised its modules yet (no forward ran), so a step "
                    "cannot take over their gradient sync; run the forward first [hpr.fsdp.open-step]"
                )
            )
        mine = {id(m) for m in fsdp_modules}
        for other_module, other in _STEPS.items():
            shared = [m for m in other.fsdp_modules if id(m) in mine]
            if shared:
                raise CheckpointError(
                    error_text(
                        f"{type(module).__name__}: its FSDP module {type(shared[0]).__name__} is already in the open "
                        f"step of {other.module_name}; give backward_input, begin_step and reduce_gradients the "
                        "same module (the stage's) for the whole step [hpr.fsdp.open-step]"
                    )
                )
        step = _Step(type(module).__name__, fsdp_modules)
        seen_ctx = set()
        for m in fsdp_modules:
            state = _Internals.state(m)
            for group in _Internals.groups(state):
                step.saved_sync.append((group, group.reduce_grads, group.all_reduce_grads))
            ctx = state._state_ctx
            if id(ctx) not in seen_ctx:
                seen_ctx.add(id(ctx))
                step.saved_last.append((ctx, ctx.is_last_backward))
        for m in fsdp_modules:
            m.set_requires_gradient_sync(False, recurse=False)
        for ctx, _ in step.saved_last:
            ctx.is_last_backward = False
        _STEPS[module] = step
        return step


def _hold(step: _Step) -> None:
    """hpr.fsdp.hold-parameters: FSDP reshards none of the step's modules by itself."""
    if step.saved_reshard is not None:
        return
    step.saved_reshard = []
    for m in step.fsdp_modules:
        for group in _Internals.groups(_Internals.state(m)):
            step.saved_reshard.append((group, group.reshard_after_backward, group.post_forward_mesh_info))
            group.reshard_after_backward, group.post_forward_mesh_info = False, None


def _release(step: _Step) -> None:
    """hpr.fsdp.reduce-once: FSDP's resharding as configured before the step (its post-backward then reshards)."""
    for group, after_backward, post_forward in step.saved_reshard or ():
        group.reshard_after_backward, group.post_forward_mesh_info = after_backward, post_forward
    step.saved_reshard = None


def holds_parameters(fsdp_module: Any) -> bool:
    """Whether an open step holds ``fsdp_module``'s parameters gathered (hpr.fsdp.hold-parameters)."""
    return any(step.saved_reshard is not None and any(m is fsdp_module for m in step.fsdp_modules)
               for step in list(_STEPS.values()))


def _restore(step: _Step) -> None:
    _release(step)
    for group, reduce, all_reduce in step.saved_sync:
        group.reduce_grads, group.all_reduce_grads = reduce, all_reduce
    for ctx, last in step.saved_last:
        ctx.is_last_backward = last


def _close(module: torch.nn.Module, step: _Step) -> None:
    step.closed = True
    _restore(step)
    with _LOCK:
        if _STEPS.get(module) is step:
            del _STEPS[module]


def begin_step(module: torch.nn.Module, *, hold_parameters: bool = False) -> bool:
    """Open a step on ``module`` now (hpr.fsdp.open-step), e.g. before a plain ``backward()`` that must not
    reduce.

    ``backward_input(..., module)`` opens it by itself; this is for a step whose first
    backward is a plain one, or (``hold_parameters``) whose caller owns the parameters'
    lifetime until ``reduce_gradients``: FSDP reshards nothing by itself meanwhile (an
    open step is switched to holding). Returns False when ``module`` contains no FSDP
    module.

    Raises:
        CheckpointError: this torch has no FSDP2 (hpr.fsdp.supported).
    """
    _need_fsdp("begin_step")
    fsdp_modules = _fsdp_modules(module)
    if not fsdp_modules:
        return False
    _Internals.check(fsdp_modules[0])
    step = _open_step(module, fsdp_modules)
    if hold_parameters:
        _hold(step)
    return True


def reduce_gradients(module: torch.nn.Module) -> bool:
    """Reduce the step's accumulated gradients of ``module`` once, after its last W (hpr.fsdp.reduce-once).

    Runs FSDP's post-backward of every parameter group with sync on (one reduce-scatter,
    plus the replicate all-reduce for HSDP, per group with a gradient), so each
    parameter's sharded ``.grad`` receives the sum over the step's microbatches, then
    FSDP's final callback; restores FSDP's settings of before the step.

    Args:
        module: the module given to ``backward_input`` (e.g. the stage's root FSDP module).

    Returns:
        True if a step was reduced, False if none was open (FSDP reduced plain backwards).

    Raises:
        CheckpointError: an I of the step has no W yet (names its weights); or no FSDP2.

    Example:
        >>> for mb in range(n):
        ...     _, state = hr.backward_input([loss[mb]], None, [], model)
        ...     hr.backward_weight(state)
        >>> hr.fsdp.reduce_gradients(model)   # the plan's REDUCE_GRAD
    """
    _need_fsdp("reduce_gradients")
    step = _STEPS.get(module)
    if step is None:
        return False
    if step.pending:
        waiting = list(dict.fromkeys(n for names in step.pending.values() for n in names))
        raise CheckpointError(
            error_text(
                f"reduce_gradients({step.module_name}): {len(step.pending)} backward_input of this step "
                f"{'has' if len(step.pending) == 1 else 'have'} no backward_weight yet (weights "
                f"{', '.join(waiting[:8])}{', ...' if len(waiting) > 8 else ''}); reducing now would leave their "
                "gradients out of this step: run every W first, or hp_recompute.fsdp.discard_step(module) to "
                "drop the step [hpr.fsdp.reduce-once]"
            )
        )
    try:
        _release(step)
        for m in step.fsdp_modules:
            m.set_requires_gradient_sync(True, recurse=False)
        for ctx, _ in step.saved_last:
            ctx.is_last_backward = True
        states = [_Internals.state(m) for m in step.fsdp_modules]
        for state in reversed(states):  # backward order: the last module's groups first
            for group in reversed(_Internals.groups(state)):
                group.post_backward()
        roots = [s for s in states if getattr(s, "_is_root", False)] or states[:1]
        for state in roots:
            state._root_post_backward_final_callback()
    finally:
        _close(module, step)
    return True


def discard_step(module: torch.nn.Module) -> bool:
    """Drop an open step of ``module`` (after a failed I or W): its unreduced gradients and pending Is.

    Restores FSDP's settings of before the step; the parameters a holding step kept
    gathered are resharded; the sharded ``.grad`` is left as it was. Returns False when
    no step was open.
    """
    step = _STEPS.get(module)
    if step is None:
        return False
    held = step.saved_reshard is not None
    for m in step.fsdp_modules:
        for group in _Internals.groups(_Internals.state(m)):
            for fp in group.fsdp_params:
                _Internals.drop_grad(fp)
    _close(module, step)
    if held:
        for m in step.fsdp_modules:
            m.reshard()
    return True


# ---------------------------------------------------------------------------------------
# The split's binding, for backward_split (hpr.fsdp.module-weights, hpr.fsdp.dx-hooks, hpr.fsdp.dw-accumulates)
# ---------------------------------------------------------------------------------------


class SplitBinding:
    """What the split needs about FSDP for one I and its W (created by ``bind``)."""

    def __init__(self, module: torch.nn.Module, step: _Step, graph_weights: List[torch.Tensor],
                 params: List[Optional[Any]], owners: List[Optional[Any]]) -> None:
        self.module_ref = weakref.ref(module)
        self.step = step
        self.graph_weights = graph_weights
        self.params = params  # FSDPParam per weight (None: not FSDP-managed)
        self.owners = owners  # FSDPModule per weight

    def started(self, names: Sequence[str]) -> None:
        """I ran (hpr.fsdp.dx-hooks): its W is pending in the step."""
        self.step.pending[id(self)] = list(names)

    def check_open(self, names: Sequence[str]) -> None:
        if self.step.closed:
            which = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise CheckpointError(
                error_text(
                    f"backward_weight: the step of {self.step.module_name} this W belongs to was already reduced "
                    f"or discarded (reduce_gradients or discard_step ran after its backward_input), so the "
                    f"gradients of weights {which} "
                    "would be left out of every reduction: call reduce_gradients after the last W of the step "
                    "[hpr.fsdp.dw-accumulates]"
                )
            )

    def unshard(self) -> List[Any]:
        """hpr.fsdp.dw-accumulates: unshard the FSDP modules of this W that are sharded now; returns them."""
        done: List[Any] = []
        for owner in dict.fromkeys(o for o in self.owners if o is not None):
            groups = _Internals.groups(_Internals.state(owner))
            if all(g.is_unsharded for g in groups):
                continue
            owner.unshard()
            done.append(owner)
        return done

    @staticmethod
    def reshard(unsharded: List[Any]) -> None:
        """hpr.fsdp.dw-accumulates: as FSDP's post-backward, reshard what W unsharded if
        ``reshard_after_backward``."""
        for owner in unsharded:
            groups = _Internals.groups(_Internals.state(owner))
            if any(g.reshard_after_backward for g in groups):
                owner.reshard()

    def accumulate(self, grads: Sequence[Optional[torch.Tensor]]) -> None:
        for fp, g in zip(self.params, grads):
            if fp is not None and g is not None:
                _Internals.accumulate(fp, g)

    def finished(self) -> None:
        self.step.pending.pop(id(self), None)


def bind(module: torch.nn.Module, weights: List[torch.Tensor], names: List[str]) -> Optional[SplitBinding]:
    """hpr.fsdp.module-weights: the FSDP binding of ``module``'s ``weights``, opening the step; None without FSDP
    modules."""
    if not _fsdp_imported():  # no module can be an FSDP module: no walk of the module
        return None
    fsdp_modules = _fsdp_modules(module)
    if not fsdp_modules:
        return None
    _Internals.check(fsdp_modules[0])
    by_id: Dict[int, Tuple[Any, Any]] = {}
    for m in fsdp_modules:
        for group in _Internals.groups(_Internals.state(m)):
            for fp in group.fsdp_params:
                by_id[id(fp.sharded_param)] = (fp, m)
                unsharded = _Internals.unsharded(fp)
                if unsharded is not None:
                    by_id[id(unsharded)] = (fp, m)
    graph: List[torch.Tensor] = []
    params: List[Optional[Any]] = []
    owners: List[Optional[Any]] = []
    for w, name in zip(weights, names):
        fp, owner = by_id.get(id(w), (None, None))
        if fp is not None:
            unsharded = _Internals.unsharded(fp)
            if unsharded is None:
                raise CheckpointError(
                    error_text(
                        f"backward_input: weight {name!r} of FSDP module {type(owner).__name__} was never "
                        "unsharded, so no forward of it can be in the graph: run the forward first "
                        "[hpr.fsdp.module-weights]"
                    )
                )
            w = unsharded
        graph.append(w)
        params.append(fp)
        owners.append(owner)
    step = _open_step(module, fsdp_modules)
    return SplitBinding(module, step, graph, params, owners)


# ---------------------------------------------------------------------------------------
# Prefetched replays (hpr.fsdp.replay-unsharded): used by checkpoint_wrapper
# ---------------------------------------------------------------------------------------


class ReplayFunction:
    """hpr.fsdp.replay-unsharded: what ``checkpoint_wrapper`` checkpoints: ``inner``, with its FSDP owner
    unsharded in replays.

    The unshard is not in ``__call__`` but in ``replay_context``, which a replay enters
    around the checkpoint's recompute context: FSDP's all-gather is not an op of the
    region, and a selective policy's recompute context (torch's SAC) would take it for
    one and refuse it ("encountered during backward but not found in storage"). Not a
    module hook either: a replay that stops early (``early_stop``) leaves the function by
    an exception that module forward hooks do not see, and the reshard must still run.
    Named as ``inner`` in messages (``frame.name()``).
    """

    __slots__ = ("owner", "inner", "__qualname__")

    def __init__(self, owner: torch.nn.Module, inner: torch.nn.Module) -> None:
        self.owner = owner
        self.inner = inner
        self.__qualname__ = getattr(inner, "__qualname__", type(inner).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)

    @contextlib.contextmanager
    def replay_context(self) -> Iterator[None]:
        """Around one replay: the owner unsharded when FSDP left it sharded, resharded after."""
        if not is_fsdp_module(self.owner):
            yield
            return
        groups = _Internals.groups(_Internals.state(self.owner))
        if not groups or all(g.is_unsharded for g in groups):
            yield
            return
        self.owner.unshard()
        if holds_parameters(self.owner):  # for the I and W that read them (hpr.fsdp.replay-unsharded)
            yield
            return
        try:
            yield
        finally:
            self.owner.reshard()  # as FSDP had it: sharded (hpr.fsdp.replay-unsharded)
