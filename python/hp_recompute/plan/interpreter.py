"""Executing one rank's plan: what each action means, written once.

A plan is run by two runtimes, the runner (``python -m hp_recompute.run``, its own stages
over a ``PipelineModel``) and ``PlannedSchedule`` (torch's ``PipelineStage`` objects). What
an action *means* is the plan's semantics and lives here; what the planner decides is in the
plan, and nothing here derives it. A runtime is a ``StageBackend``: it says how to run one
stage's forward or backward and how to move one tensor, nothing about when.

NOTE [ Executing a plan ]
=========================
This module implements the rules below; docs/rules.md states each one and why:

  hpr.exec.plan-order              the plan's order; nothing reordered, inserted or inferred
  hpr.exec.forward-handles         a forward's checkpoints belong to its (stage, microbatch)
  hpr.exec.in-memory-handoff       ``hands_to``: the output handed over in memory
  hpr.exec.replay-into-session     ``recompute`` replays its forward's handles into its session
  hpr.exec.in-backward             ``in_backward``: the backward replays as it reads
  hpr.exec.replay-in-pieces        ``recompute`` with ``regions`` replays those regions only
  hpr.exec.replay-for-weight       ``drops_replay`` drops the replay after the dx, ``for_weight`` replays for the dw
  hpr.exec.backward-in-session     backwards run in their session's context
  hpr.exec.backward-verbs          each backward is one verb of the backend: dx, dw, whole or none
  hpr.exec.frees-graph             after the last backward, the forward's handles are dropped
  hpr.exec.clear-session           ``clear`` is ``clear_recompute_session``
  hpr.exec.posts-and-waits         a ``recv`` posts its ``posts``, an action waits for its ``waits``
  hpr.exec.passthrough             send, ``reduce_grad``, ``unshard``, ``reshard``: one backend call
  hpr.exec.gradient-scaling        ``reduce_grad`` divides each parameter's gradients once per step
  hpr.exec.nothing-outlives-step   ``finish`` and ``abandon`` clear every session
  hpr.exec.run-step                ``run_step``: one step of one or more ranks in one process
  hpr.exec.without-sessions        ``sessions=False``: no replays, no clears
  hpr.exec.action-errors           ``RunError`` naming the runtime, rank and action
  hpr.exec.profiler-labels         one ``record_function`` per action
  hpr.exec.forward-only            ``forward_only``: the forward side alone
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Any, Dict, Iterator, List, Sequence, Set, Tuple

import torch

from ..checkpoint import recompute_handle_collector_ctx
from ..errors import RunError
from ..factory import raised_at
from ..frame import RecomputeHandle
from ..sessions import SessionScope
from .reader import COMPUTE_OPS, CONSUMER_OPS, Action, Plan

__all__ = ["StageBackend", "PlanInterpreter", "run_step", "plain_forwards", "forwards_are_plain", "TIMED_OPS",
           "BACKWARD_VERBS"]

#: Actions whose time is the rank's busy time (receives wait, sends are async).
TIMED_OPS = COMPUTE_OPS + ("recompute", "clear")
#: Actions that read their stage's parameters, so wait for its gather (hpr.exec.passthrough).
PARAMETER_OPS = COMPUTE_OPS + ("recompute",)
#: What a step without backward runs (hpr.exec.forward-only).
FORWARD_OPS = ("forward", "recv_f", "send_f", "unshard", "reshard")
#: What a backend's ``backward`` is asked to run (hpr.exec.backward-verbs).
BACKWARD_VERBS = ("dx", "dw", "whole", "none")

Key = Tuple[int, int]

_PLAIN = contextvars.ContextVar("hp_recompute_plain_forwards", default=False)


@contextlib.contextmanager
def plain_forwards() -> Iterator[None]:
    """Inside, planned checkpoints run their regions plainly (hpr.exec.forward-handles)."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def forwards_are_plain() -> bool:
    """Whether a ``plain_forwards()`` block is open in this context."""
    return _PLAIN.get()


class StageBackend:
    """How one runtime runs its rank's stages; ``PlanInterpreter`` decides when (NOTE).

    Every method receives the plan's action; a backend keeps its own per-(stage,
    microbatch) state (inputs, outputs, gradients in flight) and frees it in ``release``.
    """

    def forward(self, a: Action) -> Any:
        """Runs the stage's forward; returns its output."""
        raise NotImplementedError

    def pass_forward(self, a: Action, output: Any) -> None:
        """Hands forward ``a``'s output to stage ``a.hands_to``, on this rank (hpr.exec.in-memory-handoff)."""
        raise NotImplementedError

    def pass_backward(self, a: Action) -> None:
        """Hands the input gradient of ``a`` to stage ``a.hands_to``, on this rank (hpr.exec.in-memory-handoff)."""
        raise NotImplementedError

    def backward(self, a: Action, verb: str, last: bool) -> None:
        """Runs ``verb`` (hpr.exec.backward-verbs) of ``a``'s stage and microbatch: ``dx`` the input gradients (and
        what ``dw`` reads), ``dw`` the weight gradients from those, ``whole`` both (a ``backward``,
        or the ``backward_weight`` after a ``none``), ``none`` nothing (no input gradient: the
        stage sends none). ``last``: the plan's last backward of the stage this step."""
        raise NotImplementedError

    def input_requires_grad(self, a: Action) -> bool:
        """Whether any input of ``a``'s (stage, microbatch) forward needs a gradient (hpr.exec.backward-verbs)."""
        return True

    def stage_parameters(self, stage: int) -> Sequence[torch.Tensor]:
        """The parameters whose gradients the stage's backwards produce (hpr.exec.gradient-scaling)."""
        return ()

    def release(self, stage: int, mb: int) -> None:
        """The plan's last backward of (stage, mb) ran (hpr.exec.frees-graph)."""

    def send(self, a: Action) -> None:
        raise NotImplementedError

    def post_recv(self, a: Action) -> None:
        """Posts receive ``a`` (hpr.exec.posts-and-waits); a backend whose transport matches by tag may do nothing
        here."""

    def recv_ready(self, a: Action) -> bool:
        """Whether waiting for receive ``a`` would return at once (single-process scheduling)."""
        return True

    def wait_recv(self, a: Action) -> None:
        raise NotImplementedError

    def reduce_grad(self, a: Action) -> None:
        """The stage's data-parallel gradient reduction; the interpreter scales after it (hpr.exec.gradient-scaling)."""

    def unshard(self, a: Action) -> None:
        """Issues the all-gather of the stage's sharded parameters (hpr.exec.passthrough); may return before it
        ends."""

    def wait_unshard(self, stage: int) -> None:
        """Waits for the stage's gather the last ``unshard`` issued, if it is still pending (hpr.exec.passthrough)."""

    def reshard(self, a: Action) -> None:
        """Frees the stage's gathered parameters."""

    def flush(self) -> None:
        """Waits for every send of the step."""

    def before(self, index: int, a: Action) -> None:
        """Called before action ``index`` runs (the runner's planted failures)."""


class PlanInterpreter:
    """Runs one rank's program, one step at a time, on a backend.

    Args:
        runtime: names the runtime in errors (``hp_recompute.run``).
        plan: the plan (admitted: ``plan.verify.admit_plan``).
        rank: this rank, whose program (``plan.ranks[rank]``) runs.
        backend: runs the stages.
        scope: the runtime's sessions (a runtime owns its scope; NOTE [ Recompute sessions ]).
        sessions: False runs without sessions (hpr.exec.without-sessions).
        forward_only: True runs the forward side alone (hpr.exec.forward-only), without sessions.
        grad_scale: what ``reduce_grad`` divides the gradients by (hpr.exec.gradient-scaling); 1
            divides nothing.
    """

    def __init__(self, runtime: str, plan: Plan, rank: int, backend: StageBackend, scope: SessionScope,
                 sessions: bool = True, forward_only: bool = False, grad_scale: int = 1) -> None:
        self.runtime, self.rank, self.program, self.backend = runtime, rank, plan.ranks[rank], backend
        self.grad_scale = grad_scale
        self.plan_sessions = plan.sessions
        #: (stage, microbatch) -> session, of this rank's sessions replayed in pieces (hpr.exec.replay-in-pieces)
        self.in_pieces: Dict[Key, str] = {(a.stage, a.microbatch): a.session for a in self.program
                                           if a.op == "recompute" and a.regions}
        self.scope, self.sessions, self.forward_only = scope, sessions and not forward_only, forward_only
        #: stage -> the parameters its reduce_grad scales, each at the rank's last reduce_grad holding
        #: it (hpr.exec.gradient-scaling)
        self.scaled_at: Dict[int, List[torch.Tensor]] = {}
        if grad_scale != 1:
            last: Dict[int, Tuple[int, torch.Tensor]] = {}
            for a in self.program:
                if a.op == "reduce_grad":
                    last.update((id(p), (a.stage, p)) for p in self.backend.stage_parameters(a.stage))
            for stage, param in last.values():
                self.scaled_at.setdefault(stage, []).append(param)
        self.reset()

    def reset(self) -> None:
        """Starts a step."""
        self.pc = 0
        self.handles: Dict[Key, List[RecomputeHandle]] = {}
        #: index -> a receive posted and not yet waited for (hpr.exec.posts-and-waits)
        self.posted: Dict[int, Action] = {}
        #: (op, stage, plain, seconds) of every TIMED_OPS action of the step
        self.action_s: List[Tuple[str, int, bool, float]] = []
        #: sessions whose replay runs inside their backward (hpr.exec.in-backward), until their clear
        self.replayed_inside: Set[object] = set()
        #: this step's checkpoints that saved no tensor: their regions have nothing to replay
        #: (hpr.exec.forward-handles)
        self.saved_nothing = 0
        #: (stage, microbatch) whose backward_input ran ``none``: its backward_weight is ``whole``
        #: (hpr.exec.backward-verbs)
        self.whole_at_dw: Set[Key] = set()

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program)

    @property
    def busy_s(self) -> float:
        """Seconds in TIMED_OPS actions, this step."""
        return sum(seconds for *_, seconds in self.action_s)

    def ready(self) -> bool:
        """Whether the next action can run without waiting for a message (hpr.exec.posts-and-waits)."""
        a = self.program[self.pc]
        if self.forward_only and a.op not in FORWARD_OPS:  # hpr.exec.forward-only: skipped, waits for nothing
            return True
        return all(self.backend.recv_ready(self.program[j]) for j in a.waits)

    def step_one(self) -> None:
        """Runs the next action (hpr.exec.action-errors)."""
        index, a = self.pc, self.program[self.pc]
        try:
            if self.forward_only and a.op not in FORWARD_OPS:  # hpr.exec.forward-only
                self._post(a)
                self.pc += 1
                return
            self.backend.before(index, a)
            start = time.perf_counter()
            with torch.profiler.record_function(f"hp_recompute::{a.describe()}"):  # hpr.exec.profiler-labels
                self._run(a)
            # an in_backward replay is timed with its backward (hpr.exec.in-backward)
            if a.op in TIMED_OPS and not a.in_backward:
                timed_as = f"{a.op}+recompute" if a.session in self.replayed_inside else a.op
                if a.op == "recompute" and a.regions:  # hpr.exec.replay-in-pieces
                    timed_as = "recompute_piece"
                self.action_s.append((timed_as, a.stage, a.plain, time.perf_counter() - start))
        except RunError:
            raise
        except BaseException as e:  # noqa: BLE001 - re-raised with its location; SystemExit from model code too
            raise RunError(f"{self.runtime}: rank {self.rank} action {index} ({a.describe()}): {raised_at(e)}") from e
        self.pc += 1

    def _run(self, a: Action) -> None:
        op, key = a.op, (a.stage, a.microbatch)
        for j in a.waits:  # hpr.exec.posts-and-waits
            self.backend.wait_recv(self.posted.pop(j))
        if op in PARAMETER_OPS or op == "reshard":  # hpr.exec.passthrough
            self.backend.wait_unshard(a.stage)
        if op == "forward":  # hpr.exec.forward-handles
            with recompute_handle_collector_ctx() as handles, (plain_forwards() if a.plain
                                                               else contextlib.nullcontext()):
                output = self.backend.forward(a)
            self.handles[key] = list(handles)
            self.saved_nothing += sum(h.saves_nothing for h in handles)
            # hpr.exec.replay-in-pieces; no replays without sessions (hpr.exec.without-sessions)
            if self.sessions and key in self.in_pieces:
                self._check_pieces(a, self.in_pieces[key])
            if a.hands_to >= 0:  # hpr.exec.in-memory-handoff
                self.backend.pass_forward(a, output)
        elif op == "recompute":  # hpr.exec.replay-into-session
            if a.in_backward:
                self.replayed_inside.add(a.session)
            elif a.for_weight:  # hpr.exec.replay-for-weight
                if self.sessions:
                    self.scope.replay_for_weight(a.session)
                    self.saved_nothing += sum(h.saves_nothing for h in self._handles_of(a))
            elif self.sessions:
                for handle in self._piece_of(a) if a.regions else self._handles_of(a):  # hpr.exec.replay-in-pieces
                    self.scope.recompute_handle(handle, a.session)
        elif op == "clear":  # hpr.exec.clear-session
            self.replayed_inside.discard(a.session)
            if self.sessions:
                self.scope.clear_recompute_session(a.session)
        elif op in CONSUMER_OPS:  # hpr.exec.backward-in-session, hpr.exec.backward-verbs
            verb = self._verb(a)
            with (self.scope.recompute_session_ctx(a.session, a.retain_on_unpack)
                  if a.session is not None and self.sessions else contextlib.nullcontext()):
                self.backend.backward(a, verb, a.last_backward)
            if a.drops_replay and self.sessions:  # hpr.exec.replay-for-weight
                self.scope.drop_replay(a.session)
            if a.hands_to >= 0:  # hpr.exec.in-memory-handoff
                self.backend.pass_backward(a)
            if a.frees_graph:  # hpr.exec.frees-graph
                self.handles.pop(key, None)
                self.backend.release(a.stage, a.microbatch)
        elif op in ("recv_f", "recv_b"):  # hpr.exec.posts-and-waits
            self._post(a)
        elif op in ("send_f", "send_b"):
            self.backend.send(a)
        elif op == "reduce_grad":  # hpr.exec.passthrough
            self.backend.reduce_grad(a)
            for param in self.scaled_at.get(a.stage, ()):
                if param.grad is not None:
                    param.grad.div_(self.grad_scale)
        elif op == "unshard":
            self.backend.unshard(a)
        elif op == "reshard":
            self.backend.reshard(a)

    def _verb(self, a: Action) -> str:
        """What backward ``a`` runs (hpr.exec.backward-verbs)."""
        key = (a.stage, a.microbatch)
        if a.op == "backward":
            return "whole"
        if a.op == "backward_weight":
            if key in self.whole_at_dw:
                self.whole_at_dw.discard(key)
                return "whole"
            return "dw"
        if a.stage == 0 or not self.backend.input_requires_grad(a):
            self.whole_at_dw.add(key)
            return "none"
        return "dx"

    def _post(self, a: Action) -> None:
        """Posts the receives ``a`` lists, in order (hpr.exec.posts-and-waits); forward ones alone under
        hpr.exec.forward-only."""
        for j in a.posts:
            if not self.forward_only or self.program[j].op == "recv_f":
                self.backend.post_recv(self.program[j])
                self.posted[j] = self.program[j]

    def _handles_of(self, a: Action) -> List[RecomputeHandle]:
        handles = self.handles.get((a.stage, a.microbatch))
        if handles is None:
            raise RunError(f"{self.runtime}: rank {self.rank}: {a.op} of stage {a.stage} mb {a.microbatch} before "
                           f"its forward or after its last backward")
        return handles

    def _check_pieces(self, a: Action, session: str) -> None:
        """Forward ``a`` ran one checkpoint per region of ``session``, which replays in pieces
        (hpr.exec.replay-in-pieces)."""
        handles, regions = self.handles[(a.stage, a.microbatch)], self.plan_sessions[session]["regions"]
        if len(handles) != len(regions):
            raise RunError(f"{self.runtime}: rank {self.rank} action {self.pc} ({a.describe()}): ran {len(handles)} "
                           f"checkpoints, but its session {session} replays in pieces by its {len(regions)} regions "
                           f"({', '.join(regions)}); a replay in pieces needs one checkpoint per planned region, in "
                           f"forward order [hpr.exec.replay-in-pieces]")

    def _piece_of(self, a: Action) -> List[RecomputeHandle]:
        """The handles of piece ``a``'s regions (hpr.exec.replay-in-pieces; their count was checked at the
        forward)."""
        handles = self._handles_of(a)
        return [handles[i] for i in a.regions]

    def abandon(self) -> None:
        """After an error: no replayed tensor outlives the step (hpr.exec.nothing-outlives-step)."""
        self.scope.clear_all()

    def finish(self) -> List[object]:
        """Ends the step (hpr.exec.nothing-outlives-step); returns the ids of the sessions the plan left open."""
        self.backend.flush()
        if self.posted:
            unread = ", ".join(f"{a.describe()}" for a in self.posted.values())
            self.abandon()
            raise RunError(f"{self.runtime}: rank {self.rank}: received but never read: {unread}")
        return list(self.scope.clear_all())


def run_step(interpreters: Sequence[PlanInterpreter]) -> List[object]:
    """One step of each interpreter's rank, in this process (hpr.exec.run-step); returns the sessions the
    plan left open (cleared by ``finish``).

    Runs each rank's next action as soon as its receives are ready, rank after rank; a rank
    whose transport receives from other processes is always ready (its receive waits). When no
    rank can go on it raises ``RunError`` naming where each one waits. On any error every
    rank's step is abandoned (``abandon``) before the error propagates."""
    try:
        while not all(run.done for run in interpreters):
            progressed = False
            for run in interpreters:
                while not run.done and run.ready():
                    run.step_one()
                    progressed = True
            if not progressed:
                blocked = "; ".join(f"rank {run.rank} at action {run.pc} ({run.program[run.pc].describe()})"
                                    for run in interpreters if not run.done)
                raise RunError(f"{interpreters[0].runtime}: deadlock: every rank waits for a transfer: {blocked}")
        return [session for run in interpreters for session in run.finish()]
    except BaseException:
        for run in interpreters:
            run.abandon()
        raise
