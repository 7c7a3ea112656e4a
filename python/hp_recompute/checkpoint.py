"""Non-reentrant activation checkpoint whose recompute is an explicit, schedulable operation.

NOTE [ Recompute sessions ]
===========================
Zero-bubble pipeline schedules split each backward into dx (input gradients) and dw
(weight gradients), run as two separate autograd calls, often far apart. A recompute
session lets both share one replay of each checkpointed function, lets a scheduler run
that replay early (prefetch), and drops the replayed tensors at a point it chooses.
The rules below are cited in the code as "Rule N".

Rule 1 (forward). Each ``checkpoint`` call creates one frame. Autograd's saved tensors
  are replaced by holders (owned by autograd's SavedVariables) and, unless
  ``determinism_check="none"``, their shape/dtype/device are recorded. The frame keeps
  the inputs with their version counters, the RNG state (CPU, plus the device type
  torch's checkpoint infers from the positional arguments), the autocast state and the
  ``torch.device`` context. Inside ``recompute_handle_collector_ctx()`` the frame's
  handle is appended to the collected list, only once the forward succeeded. A frame
  whose forward saved no tensor (``x + 1``, a view, ``Dropout(0)``) has nothing to
  replay: its handle keeps no frame, and prefetching it is a no-op, not an error.

Rule 2 (replay). A replay runs the function once more on the forward's own input tensors
  (as torch's non-reentrant checkpoint does) under the forward's RNG, autocast and device
  state, then restores the caller's RNG streams, so a prefetch never shifts the caller's
  random numbers. An input whose version changed since the forward (an in-place op in
  the function or after it) is refused with CheckpointError before the replay runs: the
  replay would see other values. Tensors inside list, tuple and dict arguments are
  checked too (torch 2.x refuses a changed top-level positional tensor as well; torch
  1.13, and torch 2.x for a tensor inside a container, replay silently on the changed
  value). The i-th tensor the replay saves goes to the i-th holder (detached, except
  that torch 2.x, and so we, keep a tensor that does not require grad as the very
  object); a backward inside the function reads what the replay saved for it. A frame
  is never replayed from inside its own replay: ``recompute_handle`` of it there raises
  CheckpointError. With ``early_stop`` (or ``set_checkpoint_early_stop``) the replay
  stops right after the last saved tensor.
  The number of saved tensors is always checked, their metadata unless
  ``determinism_check="none"``; a mismatch raises CheckpointError (with torch's operator
  report under ``debug=True``). Where torch's checkpoint detects a condition too, a
  replay outside any session raises torch's own text, word for word (Rule 3); one for a
  session adds ``hp_recompute:``, which checkpoint and the fix. A replay shows
  in torch's profiler as ``hp_recompute::replay``.

Rule 3 (no session). A frame bound to no session behaves like the installed torch's
  ``torch.utils.checkpoint(use_reentrant=False)``: torch 2.x replays once per backward
  (graph task), or once per open ``GraphExecGroup`` (torch >= 2.10), and drops each
  tensor when read, so a second read in the same backward or group raises; torch 1.13
  replays once and keeps the tensors until autograd frees the graph (a replay that
  served a backward inside the still running forward is followed by a full one).

Rule 4 (binding). A frame is bound to at most one session, by the control plane:
  ``recompute_handle(handle, sid)`` binds and replays at once; a frame first unpacked
  while a ``recompute_session_ctx`` is open binds to it (Rule 6 says which one). Binding
  a bound frame to another session raises CheckpointError; ``clear_recompute_session``
  unbinds. Because the binding lives on the frame, a backward whose unpacks run on
  another thread finds the session without any context variable. A session takes
  precedence over an open GraphExecGroup.

Rule 5 (hot path). Unpacking a bound frame reads ``holder.value``, ``frame.pending``
  (Rule 10) and ``session.mode`` (and, for a session whose context is not open, whether
  any context is open) only: no call, no context-variable look-up, no lock (a
  session-less frame follows Rule 3; on
  torch 2.x that path takes the frame's lock on every unpack). Inside a context with
  ``retain_on_unpack=True`` the tensor stays for the next consumer; otherwise
  (``retain_on_unpack=False`` or no context open) it is dropped when read; one consumer
  that reads in several autograd calls (``backward_weight``'s groups) retains in all but
  its last (``sessions.retained_while``). A miss replays
  the frame once per binding; a miss after that replay means a non-retaining consumer
  already took the tensor, and raises CheckpointError.

Rule 6 (one context per thread). Each thread has at most one ``recompute_session_ctx``
  open, and a session is open in at most one context; entering a second raises
  CheckpointError. Threads may hold contexts of different sessions at the same time.
  An unbound frame joins the context of the unpacking thread, else (an autograd device
  thread) the only context open in the process; with several open and none on that
  thread it raises. While any context is open, a session without one is idle: its
  frames unpacked on a thread whose context belongs to another session raise, on other
  threads they are read as with no context.

Rule 7 (clear). ``clear_recompute_session`` is idempotent and drops the session's
  tensors, replay flags, counters and bindings, also after partial use, errors or
  abandoned backwards; nothing replayed stays alive and the frames can serve a new
  session or a plain backward. A failed prefetch unbinds its frame before raising.

Rule 8 (nesting). A checkpoint inside a checkpoint works in plain (session-less)
  backward. Prefetching, or replaying inside a session context, a frame that contains a
  nested checkpoint raises CheckpointError.

Rule 9 (scopes). Session ids are unique within a ``SessionScope``, not in the process:
  each owner of sessions (a schedule, a runner) makes its own scope, and two scopes may
  both hold a session ``"s3.mb0"``. The module functions act on ``DEFAULT_SCOPE``. What
  a thread has open (Rule 6) and the registry lock are process-wide; entering and
  leaving a context change the mode of one session only, so they take constant time
  however many sessions are live.

Rule 10 (devices and streams). Nothing here names a device: RNG state, autocast and
  the device context follow the device type torch's checkpoint infers (Rule 1), and
  devices are reached through torch's generic APIs (``torch.accelerator`` where present,
  else ``torch.get_device_module``). A prefetch replays on the caller's current stream,
  unless ``recompute_handle(handle, sid, stream=s)`` passes a stream of the checkpoint's
  device: then ``s`` first waits for the work the caller's stream has queued (the
  inputs), the inputs are recorded on ``s`` for the caching allocator, the replay is
  queued on ``s`` and an event is recorded after it; the host does not wait. The frame
  keeps that event (``frame.pending``) until its first consumer: the unpack of a backward
  (on the stream autograd makes current for the node, the forward's stream) or
  ``clear_recompute_session``. That consumer makes its current stream wait for the event
  and records the replayed tensors on it, so their memory is reused only after it read
  them; the hot path sees ``frame.pending`` set and leaves that one unpack to the slow
  path. RNG state is kept on the host, so a replay on a side stream draws the same
  random numbers. On a device without streams (the CPU) None is the only valid stream;
  a stream of another device than the checkpoint's inputs raises CheckpointError.

Rule 11 (torch.compile). Traced by ``torch.compile`` (torch 2.x), ``checkpoint`` is
  torch's own (its higher-order op: aot_autograd rematerializes inside the graph) and
  takes no part in sessions; inside a collector that trace raises CheckpointError instead
  of collecting nothing. A compiled function *inside* a checkpoint is an ordinary
  function: its compiled forward is what a replay reruns. Our saved-tensor hooks, which
  its compiled code calls, are hidden from dynamo once dynamo is loaded
  (``frame.hide_hooks_from_dynamo``), as torch's own are.

``use_reentrant=True`` delegates to ``torch.utils.checkpoint`` and takes no part in
sessions.
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
    """Collect the handles of the checkpoints whose forward runs inside (Rule 1).

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
    number of calls, the same errors in the same words (Rule 3). Inside
    ``recompute_handle_collector_ctx()`` it also yields a handle that a scheduler can
    prefetch with ``recompute_handle`` (Rules 1, 4).

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
    if _is_compiling():  # Rule 11
        return _compiled_checkpoint(
            function, args, kwargs, context_fn, preserve_rng_state, determinism_check, debug, early_stop
        )
    if "torch._dynamo" in sys.modules:  # Rule 11: something may be compiled inside
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
        THREAD.forward[-1].has_nested = True  # Rule 8
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
