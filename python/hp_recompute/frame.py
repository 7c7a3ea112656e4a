"""Checkpoint frames: what a checkpointed forward records and how a replay refills it.

A frame is created per ``checkpoint`` call (hpr.session.forward-frame, NOTE in
``checkpoint.py``). Autograd owns one ``Holder`` per saved tensor; the holder points back to
its frame, so the unpack hook is a plain module function that reads frame and holder fields
only (hpr.session.hot-path). A frame prefetched on a side stream keeps the event of that
replay until its first consumer has waited for it (hpr.session.side-stream).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Set, Tuple

import torch
import torch.utils.checkpoint as _torch_checkpoint

from . import replay_state
from .errors import CheckpointError, TorchCheckpointError, error_text
from .registry import CLEARED, IDLE, POP, REGISTRY, RETAIN, Session
from .replay_state import ForwardState

__all__ = ["CheckpointFrame", "Holder", "RecomputeHandle", "THREAD", "PLAIN_REPLAY", "hide_hooks_from_dynamo",
           "unpack_saved"]

# torch >= 2.0 tells which backward (graph task) is unpacking; its native checkpoint
# replays once per graph task. torch 1.13 has no such id and shares one replay (hpr.session.unbound-is-torch).
_graph_task_id: Optional[Callable[[], int]] = getattr(torch._C, "_current_graph_task_id", None)
PER_GRAPH_TASK = _graph_task_id is not None
# torch >= 2.10: backwards under one torch.utils.checkpoint.GraphExecGroup share a replay.
_graph_exec_group: Optional[Callable[[], Any]] = getattr(torch._C, "_get_graph_exec_group", None)
_outside_backward_ids = itertools.count(start=-2, step=-1)

# -- torch's wording ------------------------------------------------------------------------
# Where torch's checkpoint detects the same condition, our message carries the installed
# torch's text verbatim after "hp_recompute: " (code written against torch's checkpoint
# matches on it), then says which checkpoint and how to fix it. torch >= 2.1 appends its
# debug tip, which we take from torch itself; torch 1.13 checks neither count nor metadata.
_TORCH_TIP = getattr(_torch_checkpoint, "_debug_tip_msg", "")


def _torch_count_text(saved: int, recomputed: int) -> str:
    return (
        "torch.utils.checkpoint: A different number of tensors was saved during the original forward and "
        f"recomputation.\nNumber of tensors saved during forward: {saved}\nNumber of tensors saved during "
        f"recomputation: {recomputed}.\n"
    )


def _torch_more_text() -> str:
    return (
        "torch.utils.checkpoint: trying to save more tensors during recomputation than during the original "
        "forward pass.\n"
    )


def _replay_error(plain: bool, torch_text: str, advice: str) -> RuntimeError:
    """A replay that does not match its forward (hpr.session.faithful-replay): outside a session torch's own
    error, type and text, tip included (hpr.session.unbound-is-torch); in a session, which torch's checkpoint
    never sees, and on torch 1.13, whose checkpoint does not check, ours, with ``advice``
    (which checkpoint, what to do) before torch 2.x's text's tip."""
    if plain and PER_GRAPH_TASK:  # torch 1.13's checkpoint finds none of these: ours speaks
        return TorchCheckpointError(torch_text + _TORCH_TIP)
    return CheckpointError(error_text(f"{torch_text}{advice}\n{_TORCH_TIP}"))


def _meta(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> Dict[str, Any]:
    # the form of torch's default determinism check (_default_meta_extractor)
    return {"shape": shape, "dtype": dtype, "device": device}


def _torch_metadata_text(mismatches: List[Tuple[int, Dict[str, Any], Dict[str, Any]]]) -> str:
    listed = "".join(
        f"tensor at position {index}:\nsaved metadata: {saved}\nrecomputed metadata: {recomputed}\n"
        for index, saved, recomputed in mismatches
    )
    return (
        "torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during "
        f"the forward pass.\n{listed}.\n"
    )


def _torch_unpacked_twice_text(in_group: bool) -> str:
    if not PER_GRAPH_TASK:  # torch 1.13's checkpoint
        return (
            "Attempt to retrieve a tensor saved by autograd multiple times without checkpoint recomputation being "
            "triggered in between, this is not currently supported. Please open an issue with details on your use "
            "case so that we can prioritize adding this."
        )
    extra = (
        "Performing two backward calls that overlap (i.e. require the same saved activation in order to compute "
        "gradients) is not allowed while under the torch.utils.checkpoint.GraphExecGroup context. "
        if in_group
        else ""
    )
    return (
        "torch.utils.checkpoint: Unpack is being triggered for a tensor that was already unpacked once. "
        f"{extra}If you are calling ctx.saved_tensors in backward, make sure to do so only once. Otherwise please "
        "open an issue with details on your use case."
    )


def _replay_key() -> Tuple[Any, bool]:
    """Which plain replay an unpack belongs to, as torch's checkpoint decides it (hpr.session.unbound-is-torch).

    Returns:
        (key, repeatable): the open GraphExecGroup, else the backward's graph task id;
        outside any backward a fresh key, so every such access replays
        (``repeatable`` False: it never counts as a second unpack).
    """
    if _graph_exec_group is not None:
        group = _graph_exec_group()
        if group is not None:
            return group, True
    gid = _graph_task_id()  # type: ignore[misc]
    if gid == -1:
        return next(_outside_backward_ids), False
    return gid, True

# Marker in THREAD.replay for a replay that feeds no session (hpr.session.unbound-is-torch).
PLAIN_REPLAY = object()

# CheckpointFrame.for_weight (hpr.session.replay-for-weight).
NOT_FOR_WEIGHT = 0  #: the session's replay serves all its readers
WEIGHT_PENDING = 1  #: dropped after the dx: the next replay keeps only what the dw reads
WEIGHT_REPLAYED = 2  #: the replay for the dw ran


class _ThreadState(threading.local):
    """Per-thread forward/replay bookkeeping used by ``checkpoint`` (hpr.session.nested-plain-only).

    ``replay`` is None outside a replay, ``PLAIN_REPLAY`` or the ``Session`` being
    filled during one; ``forward`` is the stack of frames whose forward is running.
    """

    def __init__(self) -> None:
        self.replay: Any = None
        self.forward: List["CheckpointFrame"] = []


THREAD = _ThreadState()


class Holder:
    """Stands in for one saved tensor; owned by autograd's SavedVariable.

    ``value`` is the tensor recomputed for the bound session; ``shared`` (torch 1.13)
    or ``by_task`` (torch 2.x) hold plain, session-less replays. When autograd frees
    the SavedVariable, the holder and everything it holds die with it.
    """

    __slots__ = ("frame", "value", "shared", "by_task", "released", "__weakref__")

    def __init__(self, frame: "CheckpointFrame") -> None:
        self.frame = frame
        self.value: Optional[torch.Tensor] = None
        self.shared: Optional[torch.Tensor] = None
        self.by_task: Optional[Dict[Any, torch.Tensor]] = None  # keyed by graph task or group
        #: the session let ``value`` go after dx: no dw node reads it (hpr.split.release-unread)
        self.released = False


class _StopReplay(BaseException):
    """Ends a replay from inside a pack hook (early stop or a detected mismatch).

    A BaseException so that ``except Exception`` in user code does not swallow it;
    torch 1.13 rewraps hook exceptions as RuntimeError anyway, so the replay loop
    decides from ``_Replay.stopped`` / ``_Replay.error``, never from the type.
    """


def _replay_unpack(tensor: torch.Tensor) -> torch.Tensor:
    # A backward inside the replayed function (torch.autograd.grad in a block) reads
    # what the replay saved for it, as in torch's checkpoint.
    return tensor


def _store_session(holder: Holder, tensor: torch.Tensor) -> None:
    holder.value = tensor
    holder.released = False


def _store_for_weight(holder: Holder, tensor: torch.Tensor) -> None:
    """The replay for a dw keeps what the dw reads: what its dx did not release (hpr.session.replay-for-weight)."""
    if not holder.released:
        holder.value = tensor


def _note_unpack(session: Session, holder: Holder) -> None:
    """Records which autograd node unpacks ``holder`` while a dx records its reads."""
    record = session.unpacks
    if record is not None:
        record.setdefault(holder, []).append(torch._C._current_autograd_node())


def _store_shared(holder: Holder, tensor: torch.Tensor) -> None:
    holder.shared = tensor


#: Whether a replay keeps a saved tensor that does not require grad as the very object
#: (with its Python attributes), as torch 2.x's checkpoint does; torch 1.13 detaches all.
_KEEP_UNTRACKED = PER_GRAPH_TASK


class _Replay:
    """Pack hook of one replay: hands the i-th saved tensor to the i-th holder (hpr.session.faithful-replay).

    The checks follow torch's order: more tensors than the forward saved stop the
    replay at once; the count, then the metadata of each tensor, are judged when it
    ends. A tensor whose metadata differs is not stored.
    """

    __slots__ = ("frame", "store", "plain", "count", "stopped", "extra_allowed", "error", "mismatches")

    def __init__(self, frame: "CheckpointFrame", store: Callable[[Holder, torch.Tensor], None], plain: bool) -> None:
        self.frame = frame
        self.store = store
        #: for a backward outside any session: its errors are torch's own (hpr.session.unbound-is-torch)
        self.plain = plain
        self.count = 0
        self.stopped = False
        #: the replay ran past the frame's holders while its forward is still running
        #: (a backward inside the forward, without early stop): the count cannot match
        self.extra_allowed = False
        self.error: Optional[RuntimeError] = None
        #: (index, forward metadata, replay metadata) of each tensor that differs
        self.mismatches: List[Tuple[int, Dict[str, Any], Dict[str, Any]]] = []

    def take_error(self) -> RuntimeError:
        """The recorded error, forgotten here so that nothing of the replay points back to it."""
        error, self.error = self.error, None
        assert error is not None
        return error

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        frame = self.frame
        if self.stopped or self.error is not None:
            raise _StopReplay()
        if tensor.requires_grad or not _KEEP_UNTRACKED:
            tensor = tensor.detach()
        index = self.count
        self.count += 1
        expected = len(frame.holders)
        if index >= expected:
            if not frame.forward_completed:
                self.extra_allowed = True
                return tensor
            self.error = _replay_error(
                self.plain, _torch_more_text(), f"The replay of checkpoint {frame.name()} saved more tensors than "
                f"its forward ({expected}); the function must do the same work when it is recomputed."
            )
            raise _StopReplay()
        if frame.metas is not None:
            meta = (tensor.shape, tensor.dtype, tensor.device)
            if meta != frame.metas[index]:
                self.mismatches.append((index, _meta(*frame.metas[index]), _meta(*meta)))
        holder = frame.holders[index]()
        if holder is not None and not self.mismatches:  # a dead holder: autograd freed that SavedVariable
            self.store(holder, tensor)
        if frame.early_stop and self.count == expected:
            self.stopped = True
            raise _StopReplay()
        return tensor

    def end_error(self) -> Optional[RuntimeError]:
        """The count or metadata mismatch found once the replay ended, if any (torch's order)."""
        frame = self.frame
        if self.count != len(frame.holders) and not self.extra_allowed:
            return _replay_error(
                self.plain, _torch_count_text(len(frame.holders), self.count),
                f"Checkpoint {frame.name()} must do the same work when it is recomputed."
            )
        if self.mismatches:
            return _replay_error(
                self.plain, _torch_metadata_text(self.mismatches),
                f"Checkpoint {frame.name()}: make the function deterministic or pass determinism_check='none'."
            )
        return None


def _tensor_arguments(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Iterator[Tuple[str, torch.Tensor, int]]:
    """(name, tensor, version) of each tensor argument: ``#0``, ``'mask'``, and inside lists,
    tuples and dicts ``#1[0]``, ``'pair'['a']``."""
    stack: List[Tuple[str, Any]] = [(f"#{i}", a) for i, a in enumerate(args)]
    stack += [(repr(k), v) for k, v in kwargs.items()]
    stack.reverse()
    seen: Set[int] = set()  # a container is walked once (a list may hold itself)
    while stack:
        name, value = stack.pop()
        if isinstance(value, torch.Tensor):
            yield name, value, value._version
            continue
        if id(value) in seen:
            continue
        if isinstance(value, (list, tuple, dict)):
            seen.add(id(value))
        if isinstance(value, (list, tuple)):
            stack.extend(reversed([(f"{name}[{i}]", v) for i, v in enumerate(value)]))
        elif isinstance(value, dict):
            stack.extend(reversed([(f"{name}[{k!r}]", v) for k, v in value.items()]))


class CheckpointFrame:
    """Everything needed to replay one checkpoint call, plus its session binding.

    Args:
        function, args, kwargs: the checkpointed call.
        state: RNG/autocast/device snapshot of the forward.
        early_stop: stop a replay once the last saved tensor is recomputed.
        check_metadata: compare shape/dtype/device of each recomputed tensor.
        recompute_ctx: the second context manager returned by ``context_fn``.
        error_cb: with ``debug=True``, torch's callback that turns a replay mismatch into
            an error listing the operators of the forward and of the replay.
    """

    __slots__ = (
        "function",
        "args",
        "kwargs",
        "state",
        "early_stop",
        "forward_completed",
        "input_versions",
        "metas",
        "recompute_ctx",
        "error_cb",
        "holders",
        "session",
        "session_replayed",
        "for_weight",
        "plain_done",
        "shared_complete",
        "has_nested",
        "replaying",
        "pending",
        "pending_device",
        "lock",
        "__weakref__",
    )

    def __init__(
        self,
        function: Callable[..., Any],
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        state: ForwardState,
        early_stop: bool,
        check_metadata: bool,
        recompute_ctx: Optional[ContextManager[Any]],
        error_cb: Optional[Callable[[CheckpointError], None]] = None,
    ) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self.state = state
        self.early_stop = early_stop
        #: set once the forward returned; a replay before that serves a backward inside it
        self.forward_completed = False
        # hpr.session.faithful-replay: the version of every tensor argument, also inside lists, tuples and
        # dicts, to refuse a replay on inputs changed in place since (torch 2.x refuses
        # through its saved inputs, for top-level positional tensors only).
        self.input_versions = list(_tensor_arguments(args, kwargs))
        self.metas: Optional[List[Tuple[torch.Size, torch.dtype, torch.device]]] = [] if check_metadata else None
        self.recompute_ctx = recompute_ctx
        self.error_cb = error_cb
        self.holders: List["weakref.ref[Holder]"] = []
        #: The bound session (hpr.session.one-binding); read by the hot path.
        self.session: Optional[Session] = None
        self.session_replayed = False
        #: hpr.session.replay-for-weight: NOT_FOR_WEIGHT, then WEIGHT_PENDING once ``drop_for_weight``
        #: dropped the replay after the dx, WEIGHT_REPLAYED once the dw's replay ran
        self.for_weight = NOT_FOR_WEIGHT
        self.plain_done: Set[int] = set()
        #: torch 1.13: the shared plain replay ran after the forward completed (all holders)
        self.shared_complete = False
        self.has_nested = False
        #: while a replay runs: the session it fills, or PLAIN_REPLAY (hpr.session.faithful-replay)
        self.replaying: Any = None
        #: the event recorded after a replay on a side stream, until a consumer waited for it
        #: (hpr.session.side-stream); read by the hot path, which leaves such a frame to the slow path
        self.pending: Any = None
        self.pending_device: Optional[torch.device] = None
        # Per-frame, never global: serialises the replay of this frame only.
        self.lock = threading.RLock()

    def name(self) -> str:
        """The function's qualified name, for messages."""
        return "'" + getattr(self.function, "__qualname__", type(self.function).__name__) + "'"

    def devices(self) -> List[torch.device]:
        """The distinct devices of the top-level tensor arguments, in argument order
        (hpr.session.side-stream)."""
        seen: List[torch.device] = []
        for tensor in (*self.args, *self.kwargs.values()):
            if not isinstance(tensor, torch.Tensor):
                continue
            if tensor.device not in seen:
                seen.append(tensor.device)
        return seen

    # -- forward ---------------------------------------------------------------------

    def pack(self, tensor: torch.Tensor) -> Holder:
        """Forward pack hook: record a holder (and metadata) instead of the tensor (hpr.session.forward-frame)."""
        holder = Holder(self)
        self.holders.append(weakref.ref(holder))
        if self.metas is not None:
            self.metas.append((tensor.shape, tensor.dtype, tensor.device))
        return holder

    # -- replay ----------------------------------------------------------------------

    def replay(self, store: Callable[[Holder, torch.Tensor], None], session: Optional[Session]) -> None:
        """Run the function once more and hand each recomputed saved tensor to ``store`` (hpr.session.faithful-replay).

        Raises:
            CheckpointError: the replay saved a different number of tensors, or (unless
                determinism_check="none") one with different shape/dtype/device;
                torch's own CheckpointError for a replay outside any session (hpr.session.unbound-is-torch).
        """
        if not self.holders:
            return
        self._check_inputs_unchanged()
        run = _Replay(self, store, session is None)
        previous = THREAD.replay
        THREAD.replay = self.replaying = PLAIN_REPLAY if session is None else session
        try:
            # What the function needs around a replay of it, outside the recompute
            # context (fsdp.ReplayFunction: the all-gather of its sharded parameters).
            around = getattr(self.function, "replay_context", contextlib.nullcontext)
            with torch.profiler.record_function("hp_recompute::replay"), around(), self.state.restored(), \
                    torch.enable_grad():
                with self.recompute_ctx if self.recompute_ctx is not None else contextlib.nullcontext():
                    with torch.autograd.graph.saved_tensors_hooks(run.pack, _replay_unpack):
                        try:
                            # The original inputs, as torch.utils.checkpoint(use_reentrant=False)
                            # replays: a fresh leaf would reject a block that starts with an
                            # in-place op on a non-leaf input (ReLU(inplace=True)).
                            self.function(*self.args, **self.kwargs)
                        except BaseException:
                            if run.error is None and not run.stopped and not run.mismatches:
                                raise
        finally:
            THREAD.replay = previous
            self.replaying = None
        if run.error is not None:
            # Hand the error over instead of keeping it on ``run``: the replay's activations
            # reach ``run`` through autograd's C++ saved-variable hooks (run.pack), and an
            # error whose traceback reaches them back would form a cycle gc cannot see.
            # Raised outside the except block, it does not chain the replay's frames either.
            self._mismatch(run.take_error())
        error = run.end_error()
        if error is not None:
            self._mismatch(error)
        REGISTRY.count_replay(session)

    def check_not_replaying(self, session: Session) -> None:
        """Refuse a prefetch from inside this frame's own replay (hpr.session.faithful-replay); caller holds
        ``self.lock``.

        Only the replaying thread can get here while ``replaying`` is set (the replay holds
        the lock). Not a no-op: the caller of ``recompute_handle`` relies on the tensors
        being in the session when it returns, and they are not while the replay runs.
        """
        if self.replaying is None:
            return
        running = (
            "for a backward outside any session" if self.replaying is PLAIN_REPLAY
            else f"for session {self.replaying.label()}"
        )
        raise CheckpointError(
            error_text(
                f"recompute_handle(<handle of {self.name()}>, {session.label()}) was called from inside the replay "
                f"of that checkpoint (running {running}); a checkpointed function cannot prefetch itself: call "
                "recompute_handle from the schedule, outside the checkpointed function"
            )
        )

    def _mismatch(self, error: RuntimeError) -> None:
        """Raise a replay mismatch, through torch's debug report when ``debug=True``."""
        if self.error_cb is not None:
            self.error_cb(error)
        raise error

    def _check_inputs_unchanged(self) -> None:
        # A list, tuple or dict argument whose tensors were swapped since the forward: the replay
        # reads the container. (The recorded tensors are alive, so their ids are theirs alone.)
        recorded = [(name, id(tensor)) for name, tensor, _ in self.input_versions]
        now = [(name, id(tensor)) for name, tensor, _ in _tensor_arguments(self.args, self.kwargs)]
        if now != recorded:
            changed = next((a if a is not None else b)[0] for a, b in itertools.zip_longest(now, recorded) if a != b)
            raise CheckpointError(
                error_text(
                    f"argument {changed} of checkpoint {self.name()} is not the tensor the checkpoint received "
                    "(its list, tuple or dict was changed after the forward), so a replay would see other values "
                    "and give wrong gradients; pass a container the caller does not change until the backward"
                )
            )
        for name, tensor, version in self.input_versions:
            if tensor._version != version:
                raise CheckpointError(
                    error_text(
                        f"argument {name} of checkpoint {self.name()} was modified in place after the checkpoint "
                        f"received it (version {version}, now {tensor._version}), so a replay would see other "
                        "values and give wrong gradients; clone it before modifying it in place (inside the "
                        "function: x = x.clone() before x.mul_(...), or use the out-of-place op)"
                    )
                )

    # -- sessions: binding, retain, contexts, clear (hpr.session.*) ------------------

    def bind(self, session: Session) -> None:
        """Bind this frame to ``session``; caller holds ``self.lock``."""
        if session.mode == CLEARED:
            raise CheckpointError(
                error_text(
                    f"session {session.label()} was cleared inside its own recompute_session_ctx and is "
                    "used again; clear a session only after its last consumer"
                )
            )
        if self.session is not None and self.session is not session:
            raise CheckpointError(
                error_text(
                    f"checkpoint {self.name()} is bound to session {self.session.label()} and cannot join "
                    f"session {session.label()}; call clear_recompute_session("
                    f"{self.session.session_id!r}) first"
                )
            )
        if self.has_nested:
            raise CheckpointError(
                error_text(
                    f"checkpoint {self.name()} contains a nested checkpoint; scheduled recompute (prefetch or "
                    "recompute_session_ctx) of nested checkpoints is not supported; flatten the nesting or run "
                    "this backward outside any session"
                )
            )
        if self.session is None:
            self.session = session
            self.session_replayed = False
            self.for_weight = NOT_FOR_WEIGHT
            session.frames.append(weakref.ref(self))
            self._drop_plain_values()  # a session replay supersedes plain ones

    def replay_into_session(self, stream: Any = None) -> None:
        """Replay into the bound session once; on failure drop the partial values (hpr.session.clear-drops-all).

        Args:
            stream: None replays on the caller's current stream; else a stream of the
                frame's device, checked by the caller (``replay_state.check_stream``),
                on which the replay is queued (hpr.session.side-stream).
        """
        session = self.session
        assert session is not None
        store = _store_for_weight if self.for_weight == WEIGHT_PENDING else _store_session
        try:
            if stream is None:
                self.replay(store, session)
            else:
                self._replay_on_stream(stream, session, store)
        except BaseException:
            self._drop_session_values()
            raise
        self.session_replayed = True
        if self.for_weight == WEIGHT_PENDING:
            self.for_weight = WEIGHT_REPLAYED

    def drop_for_weight(self, session: Session) -> None:
        """After the session's dx: drop what it replayed, keeping which tensors the dx released, so that the
        next replay brings back only what the dw reads (hpr.session.replay-for-weight); caller holds
        ``self.lock``."""
        if self.session is not session:
            return
        if self.recompute_ctx is not None:
            raise CheckpointError(
                error_text(
                    f"checkpoint {self.name()} in session {session.label()} has a selective policy (context_fn): its "
                    "replay reads what the forward's policy saved, once, so it cannot replay again for the dw; plan "
                    "this session without a replay for its dw [hpr.session.replay-for-weight]"
                )
            )
        if self.for_weight != NOT_FOR_WEIGHT:
            raise CheckpointError(
                error_text(
                    f"session {session.label()} dropped its replay of checkpoint {self.name()} for its dw once "
                    "already; a session replays at most once more, for its dw [hpr.session.replay-for-weight]"
                )
            )
        self.await_pending()  # hpr.session.side-stream: the drop is a consumer too
        self._drop_session_values(keep_released=True)
        self.session_replayed = False
        self.for_weight = WEIGHT_PENDING

    def _replay_on_stream(self, stream: Any, session: Session,
                          store: Callable[[Holder, torch.Tensor], None]) -> None:
        """Queue the replay on ``stream`` and keep its event for the first consumer (hpr.session.side-stream)."""
        device = replay_state.stream_device(stream)
        assert device is not None
        # The inputs were produced on the caller's stream: the replay starts after that work.
        stream.wait_stream(replay_state.current_stream(device))
        # The frame may die (its graph freed) before the replay ran: the allocator must not
        # hand the inputs' memory to other work before ``stream`` has read them.
        for _, tensor, _ in self.input_versions:
            if tensor.device == device:
                replay_state.record_stream(tensor, stream)
        with replay_state.on_stream(stream):
            self.replay(store, session)
        self.pending = stream.record_event()
        self.pending_device = device

    def await_pending(self) -> None:
        """The current stream waits for a side-stream replay; caller holds ``self.lock`` (hpr.session.side-stream).

        Called by the first consumer: an unpack (on the backward node's stream, which
        autograd makes current) or the clear. The replayed tensors are recorded on that
        stream, so their memory is not reused before the consumer has read them.
        """
        event, device = self.pending, self.pending_device
        if event is None:
            return
        assert device is not None
        consumer = replay_state.current_stream(device)
        consumer.wait_event(event)
        for tensor in self.retained():
            if tensor.device == device:
                replay_state.record_stream(tensor, consumer)
        self.pending = None
        self.pending_device = None

    def unbind(self, session: Session) -> None:
        """Forget ``session``: drop its tensors and flags so the frame can serve anew (hpr.session.clear-drops-all)."""
        with self.lock:
            if self.session is session:
                self.await_pending()  # hpr.session.side-stream: the clear is a consumer too
                self._drop_session_values()
                self.session = None
                self.session_replayed = False

    def retained(self) -> List[torch.Tensor]:
        """The session tensors this frame's holders hold now."""
        return [h.value for h in (r() for r in self.holders) if h is not None and h.value is not None]

    def _drop_session_values(self, keep_released: bool = False) -> None:
        """Drops the session's tensors; ``keep_released`` keeps the marks of what a dx released
        (hpr.session.replay-for-weight)."""
        for ref in self.holders:
            holder = ref()
            if holder is not None:
                holder.value = None
                holder.released = holder.released and keep_released

    def _drop_plain_values(self) -> None:
        for ref in self.holders:
            holder = ref()
            if holder is not None:
                holder.shared = None
                holder.by_task = None

    # -- unpack slow paths -----------------------------------------------------------

    def unpack_slow(self, holder: Holder) -> torch.Tensor:
        """Everything the hot path does not handle: binding, replays, errors (hpr.session.one-binding,
        hpr.session.retain, hpr.session.one-context-per-thread, hpr.session.unbound-is-torch,
        hpr.session.side-stream)."""
        with self.lock:
            if self.pending is not None:
                self.await_pending()  # hpr.session.side-stream: the first consumer of a side-stream replay
            session = self.session
            if session is None:
                session = _context_for_this_unpack()
                if session is None:
                    return self.unpack_plain(holder)
                self.bind(session)
            mode = session.mode
            if mode == CLEARED:
                raise CheckpointError(
                    error_text(
                        f"session {session.label()} is used after clear_recompute_session; clear a session "
                        "only after its last consumer"
                    )
                )
            if mode == IDLE:
                own = REGISTRY.contexts.get(threading.get_ident())
                if own is not None:
                    raise CheckpointError(
                        error_text(
                            f"checkpoint {self.name()} belongs to session {session.label()} but is unpacked "
                            f"inside recompute_session_ctx({own.label()}); run each backward inside the "
                            "context of its own session"
                        )
                    )
                # contexts are open on other threads only: as if none were (hpr.session.one-context-per-thread)
                mode = POP
            if holder.value is None:
                if holder.released:
                    raise CheckpointError(
                        error_text(
                            f"a tensor of checkpoint {self.name()} in session {session.label()} was released "
                            "after dx because no node the dw runs read it there, yet a later backward reads it; "
                            "run that backward before backward_input's session context closes, or report this as "
                            "a bug of the split [hpr.split.release-unread]"
                        )
                    )
                if self.session_replayed:
                    raise CheckpointError(
                        error_text(
                            f"a tensor of checkpoint {self.name()} in session {session.label()} was already "
                            "consumed by a backward that did not retain it; pass retain_on_unpack=True to every "
                            "consumer but the last"
                        )
                    )
                self.replay_into_session()
            value = holder.value
            assert value is not None
            if mode == POP:
                holder.value = None
            else:
                _note_unpack(session, holder)
            return value

    def unpack_plain(self, holder: Holder) -> torch.Tensor:
        """Session-less unpack with the installed torch's native semantics (hpr.session.unbound-is-torch)."""
        with self.lock:
            if not PER_GRAPH_TASK:
                if holder.shared is None:
                    # A replay that served a backward inside the still running forward filled
                    # only the holders that existed then: the first unpack of a later holder
                    # replays again, for every holder (torch 1.13's own checkpoint fails here).
                    if self.shared_complete and any(
                        h is not None and h.shared is not None for h in (r() for r in self.holders)
                    ):
                        # torch's error (hpr.session.unbound-is-torch)
                        raise TorchCheckpointError(_torch_unpacked_twice_text(False))
                    self.replay(_store_shared, None)
                    self.shared_complete = self.forward_completed
                assert holder.shared is not None
                return holder.shared
            key, repeatable = _replay_key()
            if holder.by_task is None or key not in holder.by_task:
                if key in self.plain_done:  # torch's error (hpr.session.unbound-is-torch)
                    raise TorchCheckpointError(_torch_unpacked_twice_text(not isinstance(key, int)))
                self.replay(lambda h, t: _store_task(h, key, t), None)
                if repeatable:
                    self.plain_done.add(key)
            assert holder.by_task is not None
            return holder.by_task.pop(key)


def _context_for_this_unpack() -> Optional[Session]:
    """The open session context an unbound frame's unpack joins (hpr.session.one-context-per-thread), or None.

    The context of the unpacking thread; when that thread has none (an autograd
    device thread), the only context open in the process. With several open and none
    on this thread the backward cannot be attributed, which is an error.
    """
    contexts = REGISTRY.contexts  # replaced, never mutated: safe to read without the lock
    if not contexts:
        return None
    own = contexts.get(threading.get_ident())
    if own is not None:
        return own
    if len(contexts) == 1:
        return next(iter(contexts.values()))
    raise CheckpointError(
        error_text(
            f"a checkpoint is unpacked on a thread without a recompute_session_ctx while {len(contexts)} threads "
            "have one open, so its session is ambiguous; prefetch it with recompute_handle(handle, session_id) "
            "before the backward"
        )
    )


def _store_task(holder: Holder, key: Any, tensor: torch.Tensor) -> None:
    if holder.by_task is None:
        holder.by_task = {}
    holder.by_task[key] = tensor


def unpack_saved(holder: Holder) -> torch.Tensor:
    """The unpack hook of every checkpoint: the hot path (hpr.session.hot-path).

    A frame bound to a session returns its recomputed tensor reading only
    ``holder.value``, ``frame.pending`` and ``session.mode`` (and, for a session without
    a context of its own, ``REGISTRY.contexts``; for a retaining one, ``session.unpacks``,
    which only a dx recording its reads sets, hpr.split.release-unread): no context
    variable, no call, no lock.
    A frame whose side-stream replay no consumer has waited for yet (hpr.session.side-stream) goes to
    the slow path once. A
    session-less frame while no session context is open follows hpr.session.unbound-is-torch: on torch
    1.13 it reads ``holder.shared`` without a lock once replayed; on torch 2.x every
    such unpack takes the frame's lock (``unpack_plain``), because its per-backward
    replay bookkeeping is shared by concurrent backwards. Everything else goes to
    ``CheckpointFrame.unpack_slow``.
    """
    frame = holder.frame
    session = frame.session
    if session is not None:
        value = holder.value
        if value is not None and frame.pending is None:
            mode = session.mode
            if mode == RETAIN:
                if session.unpacks is not None:
                    _note_unpack(session, holder)
                return value
            if mode == POP or (mode == IDLE and not REGISTRY.contexts):
                holder.value = None
                return value
    elif not REGISTRY.contexts:
        if PER_GRAPH_TASK:
            return frame.unpack_plain(holder)
        value = holder.shared
        if value is not None:
            return value
    return frame.unpack_slow(holder)


class RecomputeHandle:
    """What a collector hands to the scheduler for one checkpoint call.

    Holds its frame weakly: once autograd frees the checkpoint's graph the handle is
    dead and ``recompute_handle`` says so. A checkpoint that saved no tensor (``x + 1``,
    a view, ``Dropout(0)``) has no graph of its own to keep its frame alive and nothing
    to replay: its handle keeps no frame, ``saves_nothing`` is True, and prefetching it
    is a no-op (hpr.session.forward-frame). Only ``checkpoint`` creates handles.
    """

    __slots__ = ("_frame", "_name", "saves_nothing")

    def __init__(self, frame: CheckpointFrame, *, _token: object) -> None:
        if _token is not _HANDLE_TOKEN:
            raise ValueError(
                error_text("RecomputeHandle is created by checkpoint() inside recompute_handle_collector_ctx()")
            )
        self.saves_nothing = all(ref() is None for ref in frame.holders)
        # Never the frame itself: it keeps the inputs (and what they reach) alive.
        self._frame = None if self.saves_nothing else weakref.ref(frame)
        self._name = frame.name()

    def frame(self) -> Optional[CheckpointFrame]:
        """The frame, or None once its graph is gone (always None when ``saves_nothing``)."""
        return self._frame() if self._frame is not None else None

    def __repr__(self) -> str:
        if self.saves_nothing:
            return f"RecomputeHandle({self._name}, saved=0, nothing to replay)"
        frame = self._frame()
        if frame is None:
            return f"RecomputeHandle({self._name}, <freed>)"
        bound = frame.session.session_id if frame.session is not None else None
        return f"RecomputeHandle({frame.name()}, saved={len(frame.holders)}, session={bound!r})"


_HANDLE_TOKEN = object()


def new_handle(frame: CheckpointFrame) -> RecomputeHandle:
    """Create the handle of ``frame`` (used by ``checkpoint`` only)."""
    return RecomputeHandle(frame, _token=_HANDLE_TOKEN)


# -- torch.compile (hpr.session.compiled-is-torch) -----------------------------------


_HOOKS_HIDDEN = [False]


def hide_hooks_from_dynamo() -> None:
    """hpr.session.compiled-is-torch: dynamo never compiles our saved-tensor hooks, as it never compiles torch's.

    Why: a compiled module run inside a checkpoint calls the pack hooks from its compiled
    call, and where dynamo skipped that call's own frame (``nn.Sequential(...).compile()``:
    its forward is torch's code) the frame callback is still installed, so dynamo would
    compile each hook as a frame of its own: recompiles, a graph break at a replay's
    early stop (it raises inside ``pack``), an error under ``fullgraph=True`` where
    torch's checkpoint, whose hooks live in a file dynamo skips, runs. Our hooks' modules
    join dynamo's skipped files once dynamo is loaded; a no-op on a torch without them.
    """
    if _HOOKS_HIDDEN[0]:
        return
    _HOOKS_HIDDEN[0] = True
    add = getattr(getattr(getattr(torch, "_dynamo", None), "trace_rules", None), "add", None)
    if add is not None:
        for module in ("frame", "registry"):  # the hooks' code
            add(f"{__package__}.{module}")
