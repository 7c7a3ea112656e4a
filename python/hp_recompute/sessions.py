"""The control plane of recompute sessions: prefetch, session contexts, clear, introspection.

These are the only functions that take ``REGISTRY.lock``; they bind sessions to frames
so that the unpack hot path never has to look anything up (NOTE [ Recompute sessions ]
Rules 4-7 in ``checkpoint.py``). Lock order: ``REGISTRY.lock`` first, then a frame's
lock; nothing takes ``REGISTRY.lock`` while holding a frame lock.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Hashable, Iterator, List, Optional

from .errors import CheckpointError, error_text
from .frame import CheckpointFrame, RecomputeHandle
from .registry import CLEARED, IDLE, POP, REGISTRY, RETAIN, Session
from .storage import storage_of

__all__ = [
    "recompute_handle",
    "recompute_session_ctx",
    "clear_recompute_session",
    "live_sessions",
    "session_stats",
    "stats",
    "reset_stats",
]


def _check_session_id(session_id: Any, where: str) -> None:
    if session_id is None:
        raise ValueError(error_text(f"{where}: session_id must not be None; pass a stable hashable id such as 's3.mb0'"))
    try:
        hash(session_id)
    except TypeError:
        raise ValueError(
            error_text(
                f"{where}: session_id must be hashable, got {type(session_id).__name__}; use a str, int or tuple"
            )
        ) from None


def _frame_of(handle: Any) -> CheckpointFrame:
    if not isinstance(handle, RecomputeHandle):
        raise ValueError(
            error_text(
                f"recompute_handle: expected a handle collected by recompute_handle_collector_ctx(), got "
                f"{type(handle).__name__}"
            )
        )
    frame = handle.frame()
    if frame is None:
        raise CheckpointError(
            error_text(
                "recompute_handle: the checkpoint behind this handle is gone (its autograd graph was freed); "
                "prefetch before the backward that frees the graph"
            )
        )
    return frame


def recompute_handle(handle: RecomputeHandle, session_id: Hashable) -> None:
    """Prefetch: replay one checkpoint now and keep its tensors in session ``session_id``.

    The replay restores the forward's RNG and autocast state and leaves the caller's
    RNG streams untouched. A later backward (inside ``recompute_session_ctx`` or not)
    consumes the prefetched tensors without replaying. Prefetching an already
    prefetched handle into the same session does nothing (Rule 4).

    Args:
        handle: a handle from ``recompute_handle_collector_ctx()``.
        session_id: hashable, not None; e.g. ``"s3.mb0"``.

    Raises:
        ValueError: bad handle or session id.
        CheckpointError: the handle is bound to another session, its graph is gone,
            it contains a nested checkpoint, or the replay does not match the forward.
            On failure the frame is unbound again; the session stays until cleared.

    Example:
        >>> with recompute_handle_collector_ctx() as handles:
        ...     y = checkpoint(block, x)
        >>> for h in handles:
        ...     recompute_handle(h, "s0.mb0")
    """
    # Arguments first, state after: a bad session id is reported as such even when the
    # handle's graph is gone.
    _check_session_id(session_id, "recompute_handle")
    frame = _frame_of(handle)
    with REGISTRY.lock:
        created = session_id not in REGISTRY.sessions
        session = REGISTRY.get_or_create(session_id)
        try:
            with frame.lock:
                frame.bind(session)
        except BaseException:
            _forget_if_empty(session, created)
            raise
    REGISTRY.count("prefetches")
    try:
        with frame.lock:
            if frame.session is not session or frame.session_replayed:
                return
            try:
                frame.replay_into_session()
            except BaseException:
                frame.unbind(session)  # under the frame lock: nobody sees the failed binding
                raise
    except BaseException:
        # Only after the frame lock is released: the lock order is always REGISTRY.lock,
        # then a frame lock (binding above), so a concurrent prefetch of this handle that
        # holds REGISTRY.lock and waits for the frame lock cannot deadlock with us.
        with REGISTRY.lock:
            _forget_if_empty(session, created)
        raise


def _forget_if_empty(session: Session, created: bool) -> None:
    """A failed prefetch leaves no session it created itself; caller holds REGISTRY.lock."""
    if created and not session.live_frames() and REGISTRY.sessions.get(session.session_id) is session:
        del REGISTRY.sessions[session.session_id]
        session.mode = CLEARED


@contextlib.contextmanager
def recompute_session_ctx(session_id: Hashable, retain_on_unpack: bool = False) -> Iterator[Hashable]:
    """Backwards run inside consume session ``session_id`` (Rules 4-6).

    On entry the session becomes this thread's open session: a checkpoint first
    unpacked inside binds to it and replays once; prefetched checkpoints are read
    without replay. With ``retain_on_unpack=True`` the recomputed tensors stay for a
    later consumer (dx); with False each is dropped when read (dw, the last consumer).
    One context per thread (they do not nest), one context per session; other threads
    may have contexts of their own sessions open at the same time. Call
    ``clear_recompute_session`` after the last consumer.

    Args:
        session_id: hashable, not None (no default on purpose).
        retain_on_unpack: keep recomputed tensors after they are read.

    Yields:
        ``session_id``.

    Example:
        >>> with recompute_session_ctx("s0.mb0", retain_on_unpack=True):
        ...     torch.autograd.grad(loss, [x], retain_graph=True)   # dx
        >>> with recompute_session_ctx("s0.mb0"):
        ...     torch.autograd.grad(loss, params)                    # dw
        >>> clear_recompute_session("s0.mb0")
    """
    _check_session_id(session_id, "recompute_session_ctx")
    if not isinstance(retain_on_unpack, bool):
        raise ValueError(
            error_text(
                f"recompute_session_ctx: retain_on_unpack must be a bool, got {type(retain_on_unpack).__name__}"
            )
        )
    thread = threading.get_ident()
    with REGISTRY.lock:
        mine = REGISTRY.contexts.get(thread)
        if mine is not None:
            raise CheckpointError(
                error_text(
                    f"recompute_session_ctx({session_id!r}) entered while recompute_session_ctx("
                    f"{mine.session_id!r}) is open on this thread; session contexts do not nest, exit the first "
                    "one before the next backward"
                )
            )
        session = REGISTRY.get_or_create(session_id)
        if session in REGISTRY.contexts.values():
            raise CheckpointError(
                error_text(
                    f"recompute_session_ctx({session_id!r}) is already open on another thread; run the backwards "
                    "of one session one after the other"
                )
            )
        contexts = dict(REGISTRY.contexts)
        contexts[thread] = session
        _publish(contexts)
        session.mode = RETAIN if retain_on_unpack else POP
    try:
        yield session_id
    finally:
        with REGISTRY.lock:
            contexts = dict(REGISTRY.contexts)
            del contexts[thread]
            _publish(contexts)


def _publish(contexts: Dict[int, Session]) -> None:
    """Install the open contexts and the modes that follow from them; caller holds REGISTRY.lock.

    With no context open every session pops (Rule 5); otherwise a session without a
    context of its own is IDLE and its unpacks take the slow path (Rule 6). Sessions
    with an open context keep the mode their context set (a cleared one stays CLEARED).
    """
    REGISTRY.contexts = contexts
    open_sessions = set(contexts.values())
    idle = IDLE if contexts else POP
    for session in REGISTRY.sessions.values():
        if session not in open_sessions:
            session.mode = idle


def clear_recompute_session(session_id: Hashable) -> None:
    """Drop everything session ``session_id`` holds; safe to call any number of times (Rule 7).

    Recomputed tensors, replay flags, counters and frame bindings go; the frames can
    then serve a new session or a plain backward. Call it after the last consumer,
    also on error paths (``finally``).

    Raises:
        ValueError: None or unhashable ``session_id``.
    """
    _check_session_id(session_id, "clear_recompute_session")
    with REGISTRY.lock:
        session = REGISTRY.sessions.pop(session_id, None)
        if session is None:
            return
        session.mode = CLEARED
        frames = session.live_frames()
        session.frames.clear()
    for frame in frames:
        frame.unbind(session)
    REGISTRY.count("clears")


def live_sessions() -> List[Hashable]:
    """Ids of sessions that hold state (created and not yet cleared), oldest first.

    A runtime reports ``len(live_sessions())`` after a step as "sessions left"; it
    must be 0 when every session was cleared.
    """
    with REGISTRY.lock:
        return list(REGISTRY.sessions)


def session_stats(session_id: Hashable) -> Optional[Dict[str, int]]:
    """Per-session state, or None when the session does not exist (never or cleared).

    Returns:
        ``{"replays": n, "frames": bound live frames, "retained_tensors": k,
        "retained_bytes": b}``; ``b`` counts each storage once, however many
        retained tensors view it.
    """
    _check_session_id(session_id, "session_stats")
    with REGISTRY.lock:
        session = REGISTRY.sessions.get(session_id)
        if session is None:
            return None
        frames = session.live_frames()
        replays = session.replays
    tensors = [t for frame in frames for t in frame.retained()]
    storages = {}
    for t in tensors:  # views of one storage (a saved x and x.t()) are held once
        storage = storage_of(t)
        storages[storage.data_ptr()] = storage.nbytes()
    nbytes = sum(storages.values())
    return {"replays": replays, "frames": len(frames), "retained_tensors": len(tensors), "retained_bytes": nbytes}


def stats() -> Dict[str, int]:
    """Process-wide counters since import or ``reset_stats()``.

    Returns:
        ``{"replays", "session_replays", "plain_replays", "prefetches", "clears",
        "live_sessions"}``; ``replays`` counts every replay of a checkpointed
        function (what a runtime reports as "recomputes").
    """
    return REGISTRY.snapshot()


def reset_stats() -> None:
    """Zero the counters of ``stats()``; sessions are untouched."""
    REGISTRY.reset_counters()
