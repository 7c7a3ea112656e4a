"""Control-plane state: the open session contexts, session namespaces, and replay counters.

Only the control plane (``SessionScope`` and the module functions of ``sessions.py``)
takes ``Registry.lock``. Unpacking a frame bound to a session reads ``frame.session``
and ``session.mode`` (and, for a session without a context of its own, whether any
context is open); unpacking a session-less frame reads ``Registry.contexts``, without a
lock, to tell a plain backward (hpr.session.unbound-is-torch) from one that binds the frame
(hpr.session.one-binding). See NOTE [ Recompute sessions ] in ``checkpoint.py``.

Sessions live in namespaces (``SessionScope``, hpr.session.scoped-ids): a session is one
(scope, session id) pair. What a thread has open is process-wide
(hpr.session.one-context-per-thread), because autograd threads know nothing of scopes; so
is ``Registry.lock``, which keeps the lock order of ``sessions.py`` one and the same for
every scope.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Dict, Hashable, List, Optional

if TYPE_CHECKING:  # the class is defined by the control plane, which imports this module
    from .sessions import SessionScope

__all__ = ["Session", "Registry", "REGISTRY", "POP", "RETAIN", "IDLE", "CLEARED", "SCOPE_COUNTERS"]

# Session.mode: how an unpack of a bound frame treats its recomputed tensor (hpr.session.hot-path,
# hpr.session.retain, hpr.session.one-context-per-thread, hpr.session.clear-drops-all).
POP = 0  #: its context is open with retain_on_unpack=False: hand the tensor out and drop it
RETAIN = 1  #: its context is open with retain_on_unpack=True: hand the tensor out and keep it
#: no context of its own is open: with no context open anywhere the tensor is popped (the hot
#: path checks ``REGISTRY.contexts``), else the slow path decides (hpr.session.one-context-per-thread).
#: Entering and leaving a context therefore changes one session's mode, never every session's (O(1)).
IDLE = 2
CLEARED = 3  #: cleared; any further use is an error

#: The counters every scope keeps for its own sessions (``SessionScope.stats``).
SCOPE_COUNTERS = ("session_replays", "prefetches", "clears")


class Session:
    """One recompute session: typically one (stage, microbatch) of a pipeline schedule.

    Attributes:
        session_id: the user's hashable id, unique within ``scope``.
        scope: the ``SessionScope`` that owns the session (hpr.session.scoped-ids).
        mode: one of POP, RETAIN, IDLE, CLEARED (read by the unpack hot path).
        frames: weak references to the frames bound to this session.
        replays: how many frame replays this session has run.
        unpacks: while a dx records its reads (``sessions.recording_unpacks``), each holder
            it unpacked -> the autograd nodes that unpacked it; None otherwise.
    """

    __slots__ = ("session_id", "scope", "mode", "frames", "replays", "unpacks")

    def __init__(self, session_id: Hashable, scope: "SessionScope") -> None:
        self.session_id = session_id
        self.scope = scope
        self.mode = IDLE
        self.frames: List["weakref.ref[Any]"] = []
        self.replays = 0
        self.unpacks: Optional[Dict[Any, List[Any]]] = None

    def label(self) -> str:
        """The id for messages; a session of a scope other than the default one names its scope."""
        return repr(self.session_id) + self.scope.label_suffix

    def live_frames(self) -> List[Any]:
        """The bound frames that still exist (their autograd graph is alive)."""
        return [f for f in (r() for r in self.frames) if f is not None and f.session is self]


class Registry:
    """Process-wide control-plane state (one per process, ``REGISTRY``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: Open ``recompute_session_ctx``: thread ident -> its session (hpr.session.one-context-per-thread).
        #: Replaced, never mutated, so that the unpack path can read it without the lock.
        self.contexts: Dict[int, Session] = {}
        #: Every scope, for the process-wide count of live sessions.
        self.scopes: "weakref.WeakSet[SessionScope]" = weakref.WeakSet()
        self._stats_lock = threading.Lock()
        self._counters = dict.fromkeys(("replays", "plain_replays") + SCOPE_COUNTERS, 0)

    def count_replay(self, session: Optional[Session]) -> None:
        """Record one replay (into ``session``, or plain when None); replay path, not the hot path."""
        with self._stats_lock:
            self._counters["replays"] += 1
            if session is None:
                self._counters["plain_replays"] += 1
            else:
                self._counters["session_replays"] += 1
                session.scope.counters["session_replays"] += 1
                session.replays += 1

    def count(self, scope: "SessionScope", name: str) -> None:
        """Add one to the control-plane counter ``name`` ("prefetches" or "clears") of ``scope``."""
        with self._stats_lock:
            self._counters[name] += 1
            scope.counters[name] += 1

    def snapshot(self, scope: Optional["SessionScope"] = None) -> Dict[str, int]:
        """The process-wide counters (``scope`` None) or those of ``scope``, plus its live sessions."""
        with self._stats_lock:
            if scope is not None:
                out = dict(scope.counters)
                out["replays"] = out["session_replays"]
            else:
                out = dict(self._counters)
        with self.lock:
            scopes = [scope] if scope is not None else list(self.scopes)
            out["live_sessions"] = sum(len(s.sessions) for s in scopes)
        return out

    def reset_counters(self, scope: Optional["SessionScope"] = None) -> None:
        """Zero the process-wide counters (``scope`` None) or those of ``scope``; sessions stay."""
        with self._stats_lock:
            counters = self._counters if scope is None else scope.counters
            for key in counters:
                counters[key] = 0


REGISTRY = Registry()
