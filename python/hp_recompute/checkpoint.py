"""Non-reentrant activation checkpoint whose recompute is an explicit, schedulable operation.

NOTE [ Recompute sessions ]
===========================
Zero-bubble pipeline schedules split each backward into dx (input gradients) and dw
(weight gradients), run as two separate autograd calls, often far apart. A recompute
session lets both share one replay of each checkpointed function, lets a scheduler run
that replay early (prefetch), and drops the replayed tensors at a point it chooses. This
module, with ``frame.py``, ``sessions.py`` and ``registry.py``, implements the rules below;
docs/rules.md states each one and why:

  hpr.session.forward-frame            one frame per ``checkpoint`` call, holders for its saved tensors
  hpr.session.faithful-replay          a replay reruns the function on the forward's inputs and state
  hpr.session.unbound-is-torch         without a session: the installed torch's checkpoint, errors included
  hpr.session.one-binding              a frame is bound to at most one session
  hpr.session.hot-path                 unpacking a bound frame makes no call and takes no lock
  hpr.session.retain                   ``retain_on_unpack`` keeps a tensor for the next consumer
  hpr.session.one-context-per-thread   one open session context per thread, one per session
  hpr.session.clear-drops-all          a clear is idempotent and drops everything
  hpr.session.nested-plain-only        nested checkpoints in plain backwards only
  hpr.session.scoped-ids               session ids are unique within a ``SessionScope``
  hpr.session.any-device               no device is named; torch's generic device APIs
  hpr.session.side-stream              a prefetch on a side stream; its first consumer waits
  hpr.session.compiled-is-torch        under ``torch.compile``, torch's own checkpoint
  hpr.session.replay-for-weight        after its dx a session may drop its replay and replay again for its dw
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import threading
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Tuple

import torch
import torch.utils.checkpoint as _torch_checkpoint

from .errors import CheckpointError, error_text
from .frame import (PER_GRAPH_TASK, PLAIN_REPLAY, THREAD, CheckpointFrame, RecomputeHandle, hide_hooks_from_dynamo,
                    new_handle, unpack_saved)
from .replay_state import ForwardState

__all__ = ["checkpoint", "checkpoint_call", "recompute_handle_collector_ctx"]

_COLLECTOR: "contextvars.ContextVar[Optional[List[RecomputeHandle]]]" = contextvars.ContextVar(
    "hp_recompute_collector", default=None
)

_DETERMINISM_CHECKS = ("default", "none")

#: The keywords torch's checkpoint reads itself (a function's own are passed on by ``checkpoint_call``).
_OPTIONS = frozenset(("use_reentrant", "context_fn", "preserve_rng_state", "determinism_check", "debug",
                      "early_stop"))


class _OpenCollectors:
    """How many collectors are open, in any thread: what a torch.compile trace can read.

    Why not ``_COLLECTOR``: dynamo cannot trace ``ContextVar.get`` (a graph break, an
    error under ``fullgraph=True``). It traces this plain attribute and guards on its
    value, so a graph traced with no collector open is traced again (and refused) when
    a collector is open. Counting every thread is conservative: a trace while another
    thread collects is refused too.
    """

    count = 0
    lock = threading.Lock()


@contextlib.contextmanager
def recompute_handle_collector_ctx() -> Iterator[List[RecomputeHandle]]:
    """Collect the handles of the checkpoints whose forward runs inside (hpr.session.forward-frame).

    The innermost open collector receives the handles, in forward order. A forward that
    raises, or runs under ``torch.no_grad()``, adds no handle.

    Yields:
        the list the handles are appended to.

    Example:
        >>> with recompute_handle_collector_ctx() as handles:
        ...     y = checkpoint(block1, checkpoint(block0, x))
        >>> len(handles)
        2
    """
    handles: List[RecomputeHandle] = []
    token = _COLLECTOR.set(handles)
    with _OpenCollectors.lock:
        _OpenCollectors.count += 1
    try:
        yield handles
    finally:
        with _OpenCollectors.lock:
            _OpenCollectors.count -= 1
        _COLLECTOR.reset(token)


def _is_compiling() -> bool:
    """Whether torch.compile is tracing this call (then torch's own checkpoint is used)."""
    probe = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    if probe is None:
        # torch 2.0-2.2; a trace needs torch._dynamo loaded, so never import it here
        # (torch 1.13 has none).
        probe = getattr(sys.modules.get("torch._dynamo"), "is_compiling", None)
    return bool(probe()) if probe is not None else False


def _check_determinism(determinism_check: Any) -> None:
    """torch's check, in torch's words (torch 1.13 has no such option: the same words)."""
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check should be one of {list(_DETERMINISM_CHECKS)}, but got {determinism_check}")


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: Optional[bool] = False,
    context_fn: Optional[Callable[[], Tuple[ContextManager[Any], ContextManager[Any]]]] = None,
    preserve_rng_state: bool = True,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """Run ``function(*args, **kwargs)`` saving no intermediate activations; replay it when needed.

    Outside any collector and session this is ``torch.utils.checkpoint.checkpoint(
    function, *args, use_reentrant=False)`` of the installed torch: same results, same
    number of calls, the same errors in the same words (hpr.session.unbound-is-torch). Inside
    ``recompute_handle_collector_ctx()`` it also yields a handle that a scheduler can
    prefetch with ``recompute_handle`` (hpr.session.forward-frame, hpr.session.one-binding).

    Args:
        function: the checkpointed callable.
        *args, **kwargs: its arguments (kwargs reach ``function`` unchanged; the
            keyword arguments below never do).
        use_reentrant: True, or None on torch 2.x, calls ``torch.utils.checkpoint`` with
            it and the other options as given (no handle, no session): torch's reentrant
            variant, for None after torch's warning. torch 1.13 reads None as False, and
            so do we there.
        context_fn: returns ``(forward_context, recompute_context)``; the first wraps
            the forward, the second every replay (e.g. a selective-checkpoint policy).
        preserve_rng_state: restore RNG state for replays (bit-identical dropout).
        determinism_check: "default" compares shape/dtype/device of each recomputed
            tensor; "none" only the count.
        debug: on a replay mismatch, report the operators of the forward and of the
            replay (torch >= 2.1, as torch's ``debug=True``; also switched on by
            ``torch.utils.checkpoint.set_checkpoint_debug_enabled(True)``). Accepted
            and without effect on torch 1.13, whose checkpoint has no debug mode.
        early_stop: stop a replay once the last saved tensor is recomputed;
            ``torch.utils.checkpoint.set_checkpoint_early_stop`` overrides it.

    Returns:
        whatever ``function`` returns.

    Raises:
        ValueError: a determinism_check torch does not know, or debug with a context_fn
            (torch's words). A context_fn that is not callable or returns no pair fails
            as in torch, in Python's words (TypeError).
        CheckpointError: the call is a nested checkpoint inside a session replay, runs
            under torch.compile inside a collector, or the device was initialised by
            the forward while RNG state is preserved.

    Example:
        >>> y = checkpoint(block, x, mask=m)          # like torch.utils.checkpoint
    """
    # torch's reentrant variant: True, and None on torch 2.x (its warning, then reentrant);
    # torch 1.13 reads None as false, as we do below.
    if use_reentrant or (use_reentrant is None and PER_GRAPH_TASK):
        if _COLLECTOR.get() is not None:
            raise CheckpointError(
                error_text(f"checkpoint: use_reentrant={use_reentrant!r} cannot produce a recompute handle; use "
                           "use_reentrant=False")
            )
        options = {"context_fn": context_fn} if context_fn is not None else {}
        if debug:
            options["debug"] = debug
        return _torch_checkpoint.checkpoint(
            function, *args, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state, **options, **kwargs
        )
    return checkpoint_call(function, args, kwargs, context_fn=context_fn, preserve_rng_state=preserve_rng_state,
                           determinism_check=determinism_check, debug=debug, early_stop=early_stop)


def checkpoint_call(
    function: Callable[..., Any],
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    *,
    context_fn: Optional[Callable[[], Tuple[ContextManager[Any], ContextManager[Any]]]] = None,
    preserve_rng_state: bool = True,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
) -> Any:
    """``checkpoint(function, *args, use_reentrant=False, **kwargs)`` with ``kwargs`` passed whole
    to ``function``.

    For a caller that checkpoints a module on its user's behalf (``PlannedSchedule``'s
    regions): a keyword of the module named like an option of ``checkpoint`` (``debug``,
    ``early_stop``, ``use_reentrant``, ...) reaches the module, not the checkpoint.
    """
    # Options torch reads as truth values; a bad determinism_check is refused as torch does.
    preserve_rng_state, debug, early_stop = bool(preserve_rng_state), bool(debug), bool(early_stop)
    if _is_compiling():  # hpr.session.compiled-is-torch
        return _compiled_checkpoint(
            function, args, kwargs, context_fn, preserve_rng_state, determinism_check, debug, early_stop
        )
    if "torch._dynamo" in sys.modules:  # hpr.session.compiled-is-torch: something may be compiled inside
        hide_hooks_from_dynamo()
    if _debug_enabled(debug):
        if context_fn is not None:
            raise ValueError("debug=True is incompatible with non-default context_fn")
        context_fn, error_cb = _torch_checkpoint._get_debug_context_and_cb()
    else:
        error_cb = None
    _check_determinism(determinism_check)  # after the debug check, as torch
    # As torch unpacks it: a context_fn that is not callable or returns no pair fails in Python's words.
    forward_ctx, recompute_ctx = context_fn() if context_fn is not None else (None, None)
    if not torch.is_grad_enabled():  # as torch: nothing to checkpoint, the forward context is not entered
        return function(*args, **kwargs)
    suppressed = True
    with forward_ctx if forward_ctx is not None else contextlib.nullcontext():
        output = _checkpoint_forward(
            function,
            args,
            kwargs,
            recompute_ctx,
            error_cb,
            preserve_rng_state,
            determinism_check,
            _early_stop(early_stop),
        )
        suppressed = False
    if suppressed:  # the forward raised and the context's __exit__ returned True: torch's error
        raise RuntimeError(
            "torch.utils.checkpoint: the forward context provided by context_fn suppressed an exception raised "
            "during the checkpointed forward. This is not supported because checkpoint cannot return a value for "
            "a failed forward."
        )
    return output


def _debug_enabled(debug: bool) -> bool:
    """``debug``, unless ``set_checkpoint_debug_enabled`` decides (torch >= 2.1); False on torch 1.13."""
    if not hasattr(_torch_checkpoint, "_get_debug_context_and_cb"):
        return False
    forced = getattr(_torch_checkpoint, "_checkpoint_debug_enabled", None)
    return forced if forced is not None else debug


def _early_stop(early_stop: bool) -> bool:
    """``early_stop``, unless ``set_checkpoint_early_stop`` decides (torch >= 2.0)."""
    forced = getattr(_torch_checkpoint, "_enable_checkpoint_early_stop", None)
    return forced if forced is not None else early_stop


def _compiled_checkpoint(
    function: Callable[..., Any],
    args: Tuple[Any, ...],
    kwargs: dict,
    context_fn: Any,
    preserve_rng_state: bool,
    determinism_check: str,
    debug: bool,
    early_stop: bool,
) -> Any:
    """Under a torch.compile trace: torch's own checkpoint, which compiles (no handle, no session)."""
    if _OpenCollectors.count:
        raise CheckpointError(
            error_text(
                f"checkpoint of {getattr(function, '__qualname__', type(function).__qualname__)!r} is traced by torch.compile inside "
                "recompute_handle_collector_ctx(), and a compiled checkpoint has no recompute handle; run the "
                "checkpointed forward eagerly (torch.compiler.disable on the caller) or compile inside the "
                "checkpoint: checkpoint_wrapper(block).compile() compiles the wrapped block"
            )
        )
    extra = {} if context_fn is None else {"context_fn": context_fn}
    if _OPTIONS.intersection(kwargs):  # checkpoint_call: the function's own keywords, not the checkpoint's
        function, kwargs = functools.partial(function, **kwargs), {}
    return _torch_checkpoint.checkpoint(
        function,
        *args,
        use_reentrant=False,
        preserve_rng_state=preserve_rng_state,
        determinism_check=determinism_check,
        debug=debug,
        early_stop=early_stop,
        **extra,
        **kwargs,
    )


def _checkpoint_forward(
    function: Callable[..., Any],
    args: Tuple[Any, ...],
    kwargs: dict,
    recompute_ctx: Optional[ContextManager[Any]],
    error_cb: Optional[Callable[[CheckpointError], None]],
    preserve_rng_state: bool,
    determinism_check: str,
    early_stop: bool,
) -> Any:
    replay = THREAD.replay
    if replay is not None and replay is not PLAIN_REPLAY:
        raise CheckpointError(
            error_text(
                f"checkpoint of {getattr(function, '__qualname__', function)!r} is nested in a checkpoint being "
                f"replayed for session {replay.label()}; scheduled recompute of nested checkpoints is not "
                "supported, flatten the nesting or run this backward outside any session"
            )
        )
    if THREAD.forward:
        THREAD.forward[-1].has_nested = True  # hpr.session.nested-plain-only
    state = ForwardState(args, preserve_rng_state)
    frame = CheckpointFrame(
        function, args, kwargs, state, early_stop, determinism_check == "default", recompute_ctx, error_cb
    )
    THREAD.forward.append(frame)
    try:
        with torch.autograd.graph.saved_tensors_hooks(frame.pack, unpack_saved):
            output = function(*args, **kwargs)
    finally:
        THREAD.forward.pop()
    frame.forward_completed = True
    if state.device_initialized_since():
        raise CheckpointError(
            error_text(
                f"checkpoint: {state.device_type} was initialised inside the checkpointed forward, so its RNG state "
                "could not be saved; initialise the device before the first checkpoint (e.g. "
                f"torch.{state.device_type}.init(), or put a tensor on it)"
            )
        )
    collector = _COLLECTOR.get()
    if collector is not None and replay is None:
        collector.append(new_handle(frame))
    return output
