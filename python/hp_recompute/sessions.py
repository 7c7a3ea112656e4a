"""The control plane of recompute sessions: prefetch, session contexts, clear, introspection.

Sessions live in a ``SessionScope`` (hpr.session.scoped-ids, NOTE in
``checkpoint.py``): each owner of sessions (a schedule, a runner, a model) makes its own,
so that two of them in one process may both use ids such as ``"s3.mb0"``. The module
functions (``recompute_handle``, ``recompute_session_ctx``, ...) act on
``DEFAULT_SCOPE``.

These are the only functions that take ``REGISTRY.lock``; they bind sessions to frames
so that the unpack hot path never has to look anything up (hpr.session.one-binding,
hpr.session.hot-path). Lock order:
``REGISTRY.lock`` first, then a frame's lock; nothing takes ``REGISTRY.lock`` while
holding a frame lock.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, ContextManager, Dict, Hashable, Iterator, List, Optional, Set

from .errors import CheckpointError, error_text
from .frame import NOT_FOR_WEIGHT, CheckpointFrame, RecomputeHandle
from .registry import CLEARED, IDLE, POP, REGISTRY, RETAIN, SCOPE_COUNTERS, Session
from .replay_state import check_stream
from .storage import storage_of

__all__ = [
    "SessionScope",
    "DEFAULT_SCOPE",
    "recompute_handle",
    "recompute_session_ctx",
    "clear_recompute_session",
    "live_sessions",
    "session_stats",
    "stats",
    "reset_stats",
]

_scope_numbers = itertools.count(1)


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
    try:
        equal = session_id == session_id
    except Exception:  # noqa: BLE001 -- whatever the comparison raises, the id cannot be looked up
        equal = False
    if equal is not True:  # NaN, a tensor: no id equal to it could find (nor clear) the session again
        raise ValueError(
            error_text(f"{where}: session_id {session_id!r} does not compare equal to itself; use a str, int or tuple")
        )


def _frame_of(handle: Any) -> Optional[CheckpointFrame]:
    """The handle's frame; None for a checkpoint that saved nothing (hpr.session.forward-frame: nothing to replay)."""
    if not isinstance(handle, RecomputeHandle):
        raise ValueError(
            error_text(
                f"recompute_handle: expected a handle collected by recompute_handle_collector_ctx(), got "
                f"{type(handle).__name__}"
            )
        )
    if handle.saves_nothing:
        return None
    frame = handle.frame()
    if frame is None:
        raise CheckpointError(
            error_text(
                "recompute_handle: the checkpoint behind this handle is gone (its autograd graph was freed); "
                "prefetch before the backward that frees the graph"
            )
        )
    return frame


class SessionScope:
    """A namespace of recompute sessions, owned by whoever creates it (hpr.session.scoped-ids).

    Session ids are unique within a scope: two scopes may both hold a session
    ``"s3.mb0"``, and they are different sessions (their own frames, tensors and
    counters). A pipeline schedule or a runner creates one scope and calls its methods
    instead of the module functions, which act on ``DEFAULT_SCOPE``. Everything else
    follows NOTE [ Recompute sessions ]: one context per thread, whatever its scope
    (hpr.session.one-context-per-thread), and a checkpoint is bound to one session of one
    scope at a time (hpr.session.one-binding).

    Args:
        name: for messages (``session 's3.mb0' of scope 'stage 3'``); default
            ``"scope-N"``.

    Example:
        >>> scope = SessionScope("schedule A")
        >>> scope.recompute_handle(handle, "s0.mb0")
        >>> with scope.recompute_session_ctx("s0.mb0"):
        ...     loss.backward()
        >>> scope.clear_recompute_session("s0.mb0")
    """

    def __init__(self, name: Optional[str] = None, *, _default: bool = False) -> None:
        if name is not None and not isinstance(name, str):
            raise ValueError(error_text(f"SessionScope: name must be a str or None, got {type(name).__name__}"))
        self.name = name if name is not None else f"scope-{next(_scope_numbers)}"
        #: appended to session ids in messages; empty for the default scope, whose messages name ids only
        self.label_suffix = "" if _default else f" of scope {self.name!r}"
        self.sessions: Dict[Hashable, Session] = {}
        #: written by ``REGISTRY`` under its stats lock
        self.counters: Dict[str, int] = dict.fromkeys(SCOPE_COUNTERS, 0)
        with REGISTRY.lock:
            REGISTRY.scopes.add(self)

    def __repr__(self) -> str:
        return f"SessionScope({self.name!r}, live_sessions={len(self.sessions)})"

    def _get_or_create(self, session_id: Hashable) -> Session:
        """The live session ``session_id``, created if needed; caller holds REGISTRY.lock."""
        session = self.sessions.get(session_id)
        if session is None:
            session = Session(session_id, self)
            self.sessions[session_id] = session
        return session

    def recompute_handle(self, handle: RecomputeHandle, session_id: Hashable, stream: Any = None) -> None:
        """Prefetch: replay one checkpoint now and keep its tensors in session ``session_id``.

        The replay restores the forward's RNG and autocast state and leaves the caller's
        RNG streams untouched. A later backward (inside ``recompute_session_ctx`` or not)
        consumes the prefetched tensors without replaying. Prefetching an already
        prefetched handle into the same session does nothing (hpr.session.one-binding); so does
        prefetching a checkpoint that saved no tensor (hpr.session.forward-frame: nothing to replay).

        Args:
            handle: a handle from ``recompute_handle_collector_ctx()``.
            session_id: hashable, not None; e.g. ``"s3.mb0"``.
            stream: None (default): the replay runs on the caller's current stream. A
                stream of the checkpoint's device (``torch.cuda.Stream()``,
                ``torch.Stream("cuda")``): the replay is queued on it, after the work
                the caller's stream has queued so far, and its first consumer (the
                backward that unpacks the tensors, or the clear) waits for it (hpr.session.side-stream),
                so the replay can overlap other work. The host returns once the replay
                is queued.

        Raises:
            ValueError: bad handle, session id or stream object.
            CheckpointError: the handle is bound to another session, its graph is gone,
                it contains a nested checkpoint, it is being replayed (a call from inside
                the checkpointed function), the replay does not match the forward, or
                ``stream`` is not None for a checkpoint on a device without streams (the
                CPU) or is a stream of another device. On failure the frame is unbound
                again; the session stays until cleared.

        Example:
            >>> with recompute_handle_collector_ctx() as handles:
            ...     y = checkpoint(block, x)
            >>> side = torch.cuda.Stream()
            >>> for h in handles:
            ...     recompute_handle(h, "s0.mb0", stream=side)   # overlaps what follows
        """
        # Arguments first, state after: a bad session id is reported as such even when the
        # handle's graph is gone.
        _check_session_id(session_id, "recompute_handle")
        frame = _frame_of(handle)
        if stream is not None:  # hpr.session.side-stream
            name = frame.name() if frame is not None else "a checkpoint that saved nothing"
            where = f"recompute_handle(<handle of {name}>, {session_id!r}, stream=...)"
            check_stream(stream, frame.devices() if frame is not None else [], where)
        if frame is None:
            REGISTRY.count(self, "prefetches")
            return
        with REGISTRY.lock:
            created = session_id not in self.sessions
            session = self._get_or_create(session_id)
            try:
                with frame.lock:
                    frame.check_not_replaying(session)
                    frame.bind(session)
            except BaseException:
                self._forget_if_empty(session, created)
                raise
        REGISTRY.count(self, "prefetches")
        try:
            with frame.lock:
                if frame.session is not session or frame.session_replayed:
                    return
                try:
                    frame.replay_into_session(stream)
                except BaseException:
                    frame.unbind(session)  # under the frame lock: nobody sees the failed binding
                    raise
        except BaseException:
            # Only after the frame lock is released: the lock order is always REGISTRY.lock,
            # then a frame lock (binding above), so a concurrent prefetch of this handle that
            # holds REGISTRY.lock and waits for the frame lock cannot deadlock with us.
            with REGISTRY.lock:
                self._forget_if_empty(session, created)
            raise

    def _forget_if_empty(self, session: Session, created: bool) -> None:
        """A failed prefetch leaves no session it created itself; caller holds REGISTRY.lock."""
        if created and not session.live_frames() and self.sessions.get(session.session_id) is session:
            del self.sessions[session.session_id]
            session.mode = CLEARED

    @contextlib.contextmanager
    def recompute_session_ctx(self, session_id: Hashable, retain_on_unpack: bool = False) -> Iterator[Hashable]:
        """Backwards run inside consume session ``session_id`` (hpr.session.retain,
        hpr.session.one-context-per-thread).

        On entry the session becomes this thread's open session: a checkpoint first
        unpacked inside binds to it and replays once; prefetched checkpoints are read
        without replay. With ``retain_on_unpack=True`` the recomputed tensors stay for a
        later consumer (dx); with False each is dropped when read (dw, the last consumer).
        One context per thread (they do not nest, whatever their scopes), one context per
        session; other threads may have contexts of their own sessions open at the same
        time. Entering and leaving take constant time, however many sessions are live.
        Call ``clear_recompute_session`` after the last consumer.

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
                        f"recompute_session_ctx({session_id!r}{self.label_suffix}) entered while "
                        f"recompute_session_ctx({mine.label()}) is open on this thread; session contexts do not "
                        "nest, exit the first one before the next backward"
                    )
                )
            session = self._get_or_create(session_id)
            if session in REGISTRY.contexts.values():  # one entry per thread that has a context open
                raise CheckpointError(
                    error_text(
                        f"recompute_session_ctx({session.label()}) is already open on another thread; run the "
                        "backwards of one session one after the other"
                    )
                )
            contexts = dict(REGISTRY.contexts)
            contexts[thread] = session
            REGISTRY.contexts = contexts
            session.mode = RETAIN if retain_on_unpack else POP
        try:
            yield session_id
        finally:
            with REGISTRY.lock:
                contexts = dict(REGISTRY.contexts)
                del contexts[thread]
                REGISTRY.contexts = contexts
                if session.mode != CLEARED:  # cleared inside its own context: stays cleared
                    session.mode = IDLE

    def drop_replay(self, session_id: Hashable) -> None:
        """After the session's dx: drop every tensor it replayed (hpr.session.replay-for-weight).

        What the dx released stays marked, so the next replay of the session (``replay_for_weight``, or its
        dw's first unpack) brings back only what the dw reads. A session drops its replay at most once.

        Raises:
            ValueError: None or unhashable ``session_id``.
            CheckpointError: no such live session, a context of it is open, it dropped its replay before,
                or one of its checkpoints has a selective policy (its replay runs once).
        """
        session = self._for_weight_session(session_id, "drop_replay")
        for frame in session.live_frames():
            with frame.lock:
                frame.drop_for_weight(session)

    def replay_for_weight(self, session_id: Hashable) -> None:
        """Replay the session's checkpoints again, after ``drop_replay``, keeping only what its dw reads
        (hpr.session.replay-for-weight); a checkpoint the dw already replayed stays as it is.

        Raises:
            ValueError: None or unhashable ``session_id``.
            CheckpointError: no such live session, a context of it is open, or it did not drop its replay.
        """
        session = self._for_weight_session(session_id, "replay_for_weight")
        for frame in session.live_frames():
            with frame.lock:
                if frame.session is not session:
                    continue
                if frame.for_weight == NOT_FOR_WEIGHT:
                    raise CheckpointError(
                        error_text(
                            f"replay_for_weight({session.label()}): checkpoint {frame.name()} was not dropped after "
                            "the dx; call drop_replay after the session's dx first [hpr.session.replay-for-weight]"
                        )
                    )
                if not frame.session_replayed:
                    frame.replay_into_session()

    def _for_weight_session(self, session_id: Hashable, where: str) -> Session:
        """The live session ``session_id``, with no context of its own open (hpr.session.replay-for-weight)."""
        _check_session_id(session_id, where)
        with REGISTRY.lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise CheckpointError(error_text(f"{where}({session_id!r}{self.label_suffix}): no live session has "
                                                 "this id [hpr.session.replay-for-weight]"))
            if session.mode != IDLE:
                raise CheckpointError(error_text(f"{where}({session.label()}) inside that session's own "
                                                 "recompute_session_ctx; call it between its backwards "
                                                 "[hpr.session.replay-for-weight]"))
            return session

    def clear_recompute_session(self, session_id: Hashable) -> None:
        """Drop everything session ``session_id`` holds; safe to call any number of times (hpr.session.clear-drops-all).

        Recomputed tensors, replay flags, counters and frame bindings go; the frames can
        then serve a new session or a plain backward. Call it after the last consumer,
        also on error paths (``finally``).

        Raises:
            ValueError: None or unhashable ``session_id``.
        """
        _check_session_id(session_id, "clear_recompute_session")
        self._clear(session_id)

    def _clear(self, session_id: Hashable) -> None:
        with REGISTRY.lock:
            session = self.sessions.pop(session_id, None)
            if session is None:
                return
            session.mode = CLEARED
            frames = session.live_frames()
            session.frames.clear()
        for frame in frames:
            frame.unbind(session)
        REGISTRY.count(self, "clears")

    def clear_all(self) -> List[Hashable]:
        """Clear every live session of this scope (hpr.session.clear-drops-all), e.g. after a failed step.

        Returns:
            the ids that were live, oldest first.
        """
        with REGISTRY.lock:
            ids = list(self.sessions)
        for session_id in ids:
            self._clear(session_id)
        return ids

    def live_sessions(self) -> List[Hashable]:
        """Ids of this scope's sessions that hold state (created and not yet cleared), oldest first.

        A runtime reports ``len(live_sessions())`` after a step as "sessions left"; it
        must be 0 when every session was cleared.
        """
        with REGISTRY.lock:
            return list(self.sessions)

    def session_stats(self, session_id: Hashable) -> Optional[Dict[str, int]]:
        """Per-session state, or None when the session does not exist (never or cleared).

        Returns:
            ``{"replays": n, "frames": bound live frames, "retained_tensors": k,
            "retained_bytes": b}``; ``b`` counts each storage once, however many
            retained tensors view it.
        """
        _check_session_id(session_id, "session_stats")
        with REGISTRY.lock:
            session = self.sessions.get(session_id)
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

    def stats(self) -> Dict[str, int]:
        """This scope's counters since its creation or ``reset_stats()``.

        Returns:
            ``{"replays", "session_replays", "prefetches", "clears", "live_sessions"}``;
            ``replays`` (= ``session_replays``) counts the replays into this scope's
            sessions. A replay that feeds no session (a plain backward, hpr.session.unbound-is-torch) belongs to
            no scope: only the process-wide ``stats()`` counts it (``plain_replays``).
        """
        return REGISTRY.snapshot(self)

    def reset_stats(self) -> None:
        """Zero this scope's counters; its sessions are untouched."""
        REGISTRY.reset_counters(self)


#: The scope of the module functions below (one per process).
DEFAULT_SCOPE = SessionScope("default", _default=True)


def recompute_handle(handle: RecomputeHandle, session_id: Hashable, stream: Any = None) -> None:
    """``DEFAULT_SCOPE.recompute_handle``: prefetch ``handle`` into session ``session_id``
    (on ``stream`` when given, hpr.session.side-stream)."""
    DEFAULT_SCOPE.recompute_handle(handle, session_id, stream)


@contextlib.contextmanager
def retained_while(keep: bool) -> Iterator[None]:
    """While ``keep``, the session this thread's context consumes keeps what is read, as with
    ``retain_on_unpack=True``; then its mode is restored.

    For one consumer that reads a checkpoint in several autograd calls (``backward_weight``'s
    groups, hpr.split.seed-groups): every call but the last retains, the last one
    drops what it reads, and ``clear_recompute_session`` drops the rest.
    """
    session = None
    if keep:
        with REGISTRY.lock:
            session = REGISTRY.contexts.get(threading.get_ident())
            if session is not None and session.mode == POP:
                session.mode = RETAIN
            else:
                session = None
    try:
        yield
    finally:
        if session is not None:
            with REGISTRY.lock:
                if session.mode == RETAIN:
                    session.mode = POP


@contextlib.contextmanager
def recording_unpacks() -> Iterator[Optional[Dict[Any, List[Any]]]]:
    """While open, records which autograd nodes unpack each tensor of the session this
    thread's context retains (a dx with ``retain_on_unpack=True``); yields that record
    (holder -> nodes), or None where no such session is open or one records already.

    For ``release_unread`` (hpr.split.release-unread).
    """
    with REGISTRY.lock:
        session = REGISTRY.contexts.get(threading.get_ident())
        if session is None or session.mode != RETAIN or session.unpacks is not None:
            session = None
        else:
            session.unpacks = {}
    try:
        yield None if session is None else session.unpacks
    finally:
        if session is not None:
            with REGISTRY.lock:
                session.unpacks = None


def release_unread(record: Dict[Any, List[Any]], readers: Set[Any]) -> None:
    """Drops the session tensors of ``record`` that only nodes outside ``readers`` unpacked.

    A tensor some node unpacked without being known (no current node) stays, and so does
    every tensor of a checkpoint with a ``context_fn`` (the selective policy: what its
    forward saved and what its replay recomputed share the holders, and the planner prices
    its replay whole). A released tensor read again raises CheckpointError tagged
    [hpr.split.release-unread], never a silent replay.
    """
    for holder, nodes in record.items():
        if holder.frame.recompute_ctx is not None:
            continue
        if all(node is not None and node not in readers for node in nodes):
            with holder.frame.lock:
                holder.value = None
                holder.released = True


def recompute_session_ctx(session_id: Hashable, retain_on_unpack: bool = False) -> ContextManager:
    """``DEFAULT_SCOPE.recompute_session_ctx``: backwards inside consume session ``session_id``."""
    return DEFAULT_SCOPE.recompute_session_ctx(session_id, retain_on_unpack)


def clear_recompute_session(session_id: Hashable) -> None:
    """``DEFAULT_SCOPE.clear_recompute_session``: drop everything session ``session_id`` holds."""
    DEFAULT_SCOPE.clear_recompute_session(session_id)


def live_sessions() -> List[Hashable]:
    """``DEFAULT_SCOPE.live_sessions``: ids of the default scope's live sessions, oldest first."""
    return DEFAULT_SCOPE.live_sessions()


def session_stats(session_id: Hashable) -> Optional[Dict[str, int]]:
    """``DEFAULT_SCOPE.session_stats``: state of one session of the default scope, or None."""
    return DEFAULT_SCOPE.session_stats(session_id)


def stats() -> Dict[str, int]:
    """Process-wide counters, all scopes together, since import or ``reset_stats()``.

    Returns:
        ``{"replays", "session_replays", "plain_replays", "prefetches", "clears",
        "live_sessions"}``; ``replays`` counts every replay of a checkpointed
        function (what a runtime reports as "recomputes"), ``live_sessions`` the live
        sessions of every scope.
    """
    return REGISTRY.snapshot()


def reset_stats() -> None:
    """Zero the process-wide counters of ``stats()``; sessions and scope counters are untouched."""
    REGISTRY.reset_counters()
