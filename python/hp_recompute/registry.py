"""Control-plane state: the live sessions, the open session contexts, and replay counters.

Only the control plane (``recompute_handle``, ``recompute_session_ctx``,
``clear_recompute_session``) takes ``Registry.lock``. Unpacking a frame bound to a
session reads ``frame.session`` and ``session.mode`` and nothing here (NOTE [ Recompute
sessions ] Rule 5 in ``checkpoint.py``); unpacking a session-less frame reads
``Registry.contexts``, without a lock, to tell a plain backward (Rule 3) from one that
binds the frame (Rule 4).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Hashable, List, Optional

__all__ = ["Session", "Registry", "REGISTRY", "POP", "RETAIN", "IDLE", "CLEARED"]

# Session.mode: how an unpack of a bound frame treats its recomputed tensor (Rules 5-7).
POP = 0  #: hand the tensor out and drop it (retain_on_unpack=False, or no context open at all)
RETAIN = 1  #: hand the tensor out and keep it for a later consumer (retain_on_unpack=True)
IDLE = 2  #: some thread has a context open, none for this session: the slow path decides (Rule 6)
CLEARED = 3  #: cleared; any further use is an error


class Session:
    """One recompute session: typically one (stage, microbatch) of a pipeline schedule.

    Attributes:
        session_id: the user's hashable id.
        mode: one of POP, RETAIN, IDLE, CLEARED (read by the unpack hot path).
        frames: weak references to the frames bound to this session.
        replays: how many frame replays this session has run.
    """

    __slots__ = ("session_id", "mode", "frames", "replays")

    def __init__(self, session_id: Hashable, mode: int) -> None:
        self.session_id = session_id
        self.mode = mode
        self.frames: List["weakref.ref[Any]"] = []
        self.replays = 0

    def live_frames(self) -> List[Any]:
        """The bound frames that still exist (their autograd graph is alive)."""
        return [f for f in (r() for r in self.frames) if f is not None and f.session is self]


class Registry:
    """Process-wide control-plane state (one per process, ``REGISTRY``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.sessions: Dict[Hashable, Session] = {}
        #: Open ``recompute_session_ctx``: thread ident -> its session (Rule 6). Replaced,
        #: never mutated, so that the unpack path can read it without the lock.
        self.contexts: Dict[int, Session] = {}
        self._stats_lock = threading.Lock()
        self._counters = dict.fromkeys(("replays", "session_replays", "plain_replays", "prefetches", "clears"), 0)

    def get_or_create(self, session_id: Hashable) -> Session:
        """Return the live session ``session_id``; caller holds ``lock``."""
        session = self.sessions.get(session_id)
        if session is None:
            session = Session(session_id, IDLE if self.contexts else POP)
            self.sessions[session_id] = session
        return session

    def count_replay(self, session: Optional[Session]) -> None:
        """Record one replay (into ``session``, or plain when None); replay path, not the hot path."""
        with self._stats_lock:
            self._counters["replays"] += 1
            if session is None:
                self._counters["plain_replays"] += 1
            else:
                self._counters["session_replays"] += 1
                session.replays += 1

    def count(self, name: str) -> None:
        """Add one to the control-plane counter ``name`` ("prefetches" or "clears")."""
        with self._stats_lock:
            self._counters[name] += 1

    def snapshot(self) -> Dict[str, int]:
        """Counters plus the number of live sessions."""
        with self._stats_lock:
            out = dict(self._counters)
        out["live_sessions"] = len(self.sessions)
        return out

    def reset_counters(self) -> None:
        """Zero the counters (live sessions are unaffected)."""
        with self._stats_lock:
            for key in self._counters:
                self._counters[key] = 0


REGISTRY = Registry()
