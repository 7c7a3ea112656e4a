"""Executing one rank's plan: what each action means, written once.

Why one module: a plan is run by two runtimes, the runner (``python -m hp_recompute.run``,
its own stages over a ``PipelineModel``) and ``PlannedSchedule`` (torch's
``PipelineStage`` objects). What an action *means* (which session a replay fills, which
backward reads it with which retain flag, when a forward's handles die, which receives a
``recv`` posts and who waits for them, that every session is cleared by the end of the
step) is the plan's semantics and lives here. What the planner decides (where gradients
are reduced, when receives are posted, which action reads each, the last backward of each
stage, the in-memory handoffs) is in the plan; nothing here derives it. A runtime is a
``StageBackend``: it says how to run one stage's forward or backward and how to move one
tensor, nothing about when.

NOTE [ Executing a plan ]
=========================
The code cites these as "Rule N".

Rule 1 (order). Actions run one at a time in the plan's order. Nothing is reordered,
  inserted or inferred: the planner lowered into the plan where each gradient
  reduction goes, which receives each ``recv`` posts and which action waits for each
  (``posts``, ``waits``), each stage's last backward (``last_backward``) and the
  in-memory handoffs (``hands_to``) (docs/plan-format.md), and the verifier admitted the
  plan before any rank ran (verifier rules 8-12).

Rule 2 (forward). ``backend.forward`` runs inside ``recompute_handle_collector_ctx``: the
  handles of the checkpoints it creates belong to its (stage, microbatch). A forward the
  plan marks ``"checkpoint": false`` runs inside ``plain_forwards()``, where planned
  checkpoints run their regions plainly (saving their activations). A checkpoint that
  saved no tensor (a region such as ``x * 2``) has nothing to replay: its recompute is
  done by nothing (``saved_nothing`` counts them for a runtime's replay check).

Rule 2a (co-located neighbours). The plan has no transfer between two stages on one
  rank (V-shaped schedules): a forward, ``backward_input`` or ``backward`` that says
  ``hands_to`` hands its output (input gradient) to that stage in memory
  (``backend.pass_forward`` / ``backend.pass_backward``) right after the action.

Rule 3 (recompute). ``recompute`` replays every handle of its forward into the plan's
  session (``scope.recompute_handle``). One marked ``in_backward`` replays nothing here:
  its session's one reader, a whole backward (a ``backward``, or the first stage's
  ``backward_weight``: that stage's ``backward_input`` reads nothing and names no
  session; the next compute action, hpr-verify's in_backward check), runs in the session's context
  with ``retain_on_unpack=False``, where each checkpoint replays into the session when
  the backward first reads it and each tensor is dropped as it is read, so one region's
  replayed tensors are live at a time, as under torch's checkpoint. Its time is that
  backward's: the backward is timed as ``backward+recompute`` (``backward_weight+recompute``).

Rule 3a (pieces). A ``recompute`` with ``regions`` is a piece of its session's replay: it
  prefetches only the handles of those regions, numbered as the session's ``regions`` (the
  stage's checkpointed regions in forward order), which are the forward's handles in the
  order its checkpoints ran; a forward whose handle count differs from its session's region
  count is refused at that forward, before anything of its session is replayed. The
  session's last piece may be ``in_backward``: its regions replay inside the backward as in
  Rule 3, which reads the prefetched pieces' tensors without replaying them and drops each
  as it reads it (``retain_on_unpack=False``). A prefetched piece is timed as
  ``recompute_piece``.

Rule 4 (backwards). ``backward_input``, ``backward_weight`` and ``backward`` run inside
  ``scope.recompute_session_ctx(session, retain_on_unpack)`` when the action names a
  session, so the dx and the dw of a microbatch read one replay. Each becomes one verb of
  the backend (``StageBackend.backward``): a ``backward`` is ``whole``; a
  ``backward_input`` is ``dx``, or ``none`` where it has nothing to differentiate (the
  first stage, whose input no stage before it waits for, and a stage none of whose inputs
  needs a gradient this microbatch, after frozen stages: ``backend.input_requires_grad``),
  and its ``backward_weight`` is then ``whole`` (the weights' gradients start from the
  outputs, as torch's stages run the first stage's W), otherwise ``dw``. The backend is
  told whether the action is its stage's last ``W`` or ``B`` of the step, as the plan's
  ``last_backward`` says (the "last backward" of torch's stages: DDP reduces there).

Rule 5 (frees_graph). After the plan's last backward of (stage, microbatch), the handles
  of its forward are dropped and ``backend.release`` frees what the backend kept for it.

Rule 6 (clear). ``clear`` is ``scope.clear_recompute_session``.

Rule 7 (receives). A ``recv_*`` action posts the receives its ``posts`` lists, in that
  order: torch's point-to-point ops carry no tag, so between two ranks receives match
  sends in posting order, and the planner put the peer's send order there. An action
  waits for exactly the receives its ``waits`` lists (the plan's reader of each
  receive), and is ready when they are. A receive posted and never read (no action
  waited for it) is an error at the end of the step.

Rule 8 (sends, reduce_grad, unshard, reshard). Each is one backend call at its place;
  sends are asynchronous and waited for by ``finish``. An ``unshard`` issues its stage's
  all-gather and returns (the plan placed it ahead of its readers so that the gather
  overlaps their compute, as torch's runtime issues UNSHARD); the next action that reads
  the stage's parameters (``PARAMETER_OPS``: a forward, a replay, any backward) or
  releases them (``reshard``) first waits for it (``backend.wait_unshard``). After
  ``backend.reduce_grad`` (the data-parallel reduction) the interpreter divides the
  gradients by ``grad_scale`` (the microbatch count: each microbatch's loss is a mean),
  each parameter once per step, at the last ``reduce_grad`` of this rank whose stage
  holds it (``backend.stage_parameters``; a parameter two stages of the rank share gets
  both stages' gradients first), as torch's ``scale_grads`` does per stage.

Rule 9 (end of step). ``finish`` waits for the sends and clears the sessions still
  open, returning their ids: the plan promised a clear for each, so a runtime reports
  them as a failure. After an error ``abandon`` clears every session of the scope, so
  no replayed tensor outlives the step. ``run_step`` drives one step of one or more
  ranks' interpreters in one process (each action as soon as its receives are ready;
  none ready on any rank is a deadlock), ends it with ``finish`` and abandons every
  rank's step on an error: both runtimes' step, single-process or one rank per process.

Rule 10 (without sessions). With ``sessions=False`` (the runner's ``native`` and
  ``none`` modes: torch's checkpoint, or none) ``recompute`` and ``clear`` do nothing and
  backwards run outside any session.

Rule 11 (errors). An error of an action is raised as ``RunError`` naming the runtime,
  the rank, the action's index and the action, and where the user's code raised it.

Rule 12 (profiling). Each action runs inside torch's ``record_function`` named
  ``hp_recompute::`` and the action (``hp_recompute::backward_input stage 1 mb 0 session
  s1.mb0``), as torch's own pipeline runtime labels its actions, so a profiler trace
  shows the plan; a replay inside it shows as ``hp_recompute::replay``.

Rule 13 (forward only). With ``forward_only`` (a schedule's ``eval``, or one built
  without a loss function) only the forward side runs, in the plan's order: forwards,
  their transfers (``recv_f``, ``send_f``) and ``unshard``/``reshard``; every backward,
  replay, clear, gradient transfer and reduction is skipped, with no session (Rule 10). A
  skipped action still posts the forward receives among its ``posts``: every rank skips
  the same kinds, so between two ranks forward receives still meet their sends in order.
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
#: Actions that read their stage's parameters, so wait for its gather (Rule 8).
PARAMETER_OPS = COMPUTE_OPS + ("recompute",)
#: What a step without backward runs (Rule 13).
FORWARD_OPS = ("forward", "recv_f", "send_f", "unshard", "reshard")
#: What a backend's ``backward`` is asked to run (Rule 4).
BACKWARD_VERBS = ("dx", "dw", "whole", "none")

Key = Tuple[int, int]

_PLAIN = contextvars.ContextVar("hp_recompute_plain_forwards", default=False)


@contextlib.contextmanager
def plain_forwards() -> Iterator[None]:
    """Inside, planned checkpoints run their regions plainly (Rule 2)."""
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
        """Hands forward ``a``'s output to stage ``a.hands_to``, on this rank (Rule 2a)."""
        raise NotImplementedError

    def pass_backward(self, a: Action) -> None:
        """Hands the input gradient of ``a`` to stage ``a.hands_to``, on this rank (Rule 2a)."""
        raise NotImplementedError

    def backward(self, a: Action, verb: str, last: bool) -> None:
        """Runs ``verb`` (Rule 4) of ``a``'s stage and microbatch: ``dx`` the input gradients (and
        what ``dw`` reads), ``dw`` the weight gradients from those, ``whole`` both (a ``backward``,
        or the ``backward_weight`` after a ``none``), ``none`` nothing (no input gradient: the
        stage sends none). ``last``: the plan's last backward of the stage this step."""
        raise NotImplementedError

    def input_requires_grad(self, a: Action) -> bool:
        """Whether any input of ``a``'s (stage, microbatch) forward needs a gradient (Rule 4)."""
        return True

    def stage_parameters(self, stage: int) -> Sequence[torch.Tensor]:
        """The parameters whose gradients the stage's backwards produce (Rule 8's scaling)."""
        return ()

    def release(self, stage: int, mb: int) -> None:
        """The plan's last backward of (stage, mb) ran (Rule 5)."""

    def send(self, a: Action) -> None:
        raise NotImplementedError

    def post_recv(self, a: Action) -> None:
        """Posts receive ``a`` (Rule 7); a backend whose transport matches by tag may do nothing here."""

    def recv_ready(self, a: Action) -> bool:
        """Whether waiting for receive ``a`` would return at once (single-process scheduling)."""
        return True

    def wait_recv(self, a: Action) -> None:
        raise NotImplementedError

    def reduce_grad(self, a: Action) -> None:
        """The stage's data-parallel gradient reduction; the interpreter scales after it (Rule 8)."""

    def unshard(self, a: Action) -> None:
        """Issues the all-gather of the stage's sharded parameters (Rule 8); may return before it ends."""

    def wait_unshard(self, stage: int) -> None:
        """Waits for the stage's gather the last ``unshard`` issued, if it is still pending (Rule 8)."""

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
        sessions: False runs without sessions (Rule 10).
        forward_only: True runs the forward side alone (Rule 13), without sessions.
        grad_scale: what ``reduce_grad`` divides the gradients by (Rule 8); 1 divides nothing.
    """

    def __init__(self, runtime: str, plan: Plan, rank: int, backend: StageBackend, scope: SessionScope,
                 sessions: bool = True, forward_only: bool = False, grad_scale: int = 1) -> None:
        self.runtime, self.rank, self.program, self.backend = runtime, rank, plan.ranks[rank], backend
        self.grad_scale = grad_scale
        self.plan_sessions = plan.sessions
        #: (stage, microbatch) -> session, of this rank's sessions replayed in pieces (Rule 3a)
        self.in_pieces: Dict[Key, str] = {(a.stage, a.microbatch): a.session for a in self.program
                                           if a.op == "recompute" and a.regions}
        self.scope, self.sessions, self.forward_only = scope, sessions and not forward_only, forward_only
        self.reset()

    def reset(self) -> None:
        """Starts a step."""
        self.pc = 0
        self.handles: Dict[Key, List[RecomputeHandle]] = {}
        self.posted: Dict[int, Action] = {}  # index -> a receive posted and not yet waited for (Rule 7)
        #: (op, stage, plain, seconds) of every TIMED_OPS action of the step
        self.action_s: List[Tuple[str, int, bool, float]] = []
        #: sessions whose replay runs inside their backward (Rule 3), until their clear
        self.replayed_inside: Set[object] = set()
        #: this step's checkpoints that saved no tensor: their regions have nothing to replay (Rule 2)
        self.saved_nothing = 0
        #: (stage, microbatch) whose backward_input ran ``none``: its backward_weight is ``whole`` (Rule 4)
        self.whole_at_dw: Set[Key] = set()
        #: stage -> the parameters its reduce_grad scales, each at its rank's last reduce_grad holding it (Rule 8)
        self.scaled_at: Dict[int, List[torch.Tensor]] = {}
        if self.grad_scale != 1:
            last: Dict[int, Tuple[int, torch.Tensor]] = {}
            for a in self.program:
                if a.op == "reduce_grad":
                    last.update((id(p), (a.stage, p)) for p in self.backend.stage_parameters(a.stage))
            for stage, param in last.values():
                self.scaled_at.setdefault(stage, []).append(param)

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program)

    @property
    def busy_s(self) -> float:
        """Seconds in TIMED_OPS actions, this step."""
        return sum(seconds for *_, seconds in self.action_s)

    def ready(self) -> bool:
        """Whether the next action can run without waiting for a message (Rule 7)."""
        a = self.program[self.pc]
        if self.forward_only and a.op not in FORWARD_OPS:  # Rule 13: skipped, waits for nothing
            return True
        return all(self.backend.recv_ready(self.program[j]) for j in a.waits)

    def step_one(self) -> None:
        """Runs the next action (Rule 11)."""
        index, a = self.pc, self.program[self.pc]
        try:
            if self.forward_only and a.op not in FORWARD_OPS:  # Rule 13
                self._post(a)
                self.pc += 1
                return
            self.backend.before(index, a)
            start = time.perf_counter()
            with torch.profiler.record_function(f"hp_recompute::{a.describe()}"):  # Rule 12
                self._run(a)
            if a.op in TIMED_OPS and not a.in_backward:  # Rule 3: timed with its backward
                timed_as = f"{a.op}+recompute" if a.session in self.replayed_inside else a.op
                if a.op == "recompute" and a.regions:  # Rule 3a
                    timed_as = "recompute_piece"
                self.action_s.append((timed_as, a.stage, a.plain, time.perf_counter() - start))
        except RunError:
            raise
        except BaseException as e:  # noqa: BLE001 - re-raised with its location; SystemExit from model code too
            raise RunError(f"{self.runtime}: rank {self.rank} action {index} ({a.describe()}): {raised_at(e)}") from e
        self.pc += 1

    def _run(self, a: Action) -> None:
        op, key = a.op, (a.stage, a.microbatch)
        for j in a.waits:  # Rule 7
            self.backend.wait_recv(self.posted.pop(j))
        if op in PARAMETER_OPS or op == "reshard":  # Rule 8
            self.backend.wait_unshard(a.stage)
        if op == "forward":  # Rule 2
            with recompute_handle_collector_ctx() as handles, (plain_forwards() if a.plain
                                                               else contextlib.nullcontext()):
                output = self.backend.forward(a)
            self.handles[key] = list(handles)
            self.saved_nothing += sum(h.saves_nothing for h in handles)
            if self.sessions and key in self.in_pieces:  # Rule 3a (Rule 10: no replays without sessions)
                self._check_pieces(a, self.in_pieces[key])
            if a.hands_to >= 0:  # Rule 2a
                self.backend.pass_forward(a, output)
        elif op == "recompute":  # Rule 3
            if a.in_backward:
                self.replayed_inside.add(a.session)
            elif self.sessions:
                for handle in self._piece_of(a) if a.regions else self._handles_of(a):  # Rule 3a
                    self.scope.recompute_handle(handle, a.session)
        elif op == "clear":  # Rule 6
            self.replayed_inside.discard(a.session)
            if self.sessions:
                self.scope.clear_recompute_session(a.session)
        elif op in CONSUMER_OPS:  # Rule 4
            verb = self._verb(a)
            with (self.scope.recompute_session_ctx(a.session, a.retain_on_unpack)
                  if a.session is not None and self.sessions else contextlib.nullcontext()):
                self.backend.backward(a, verb, a.last_backward)
            if a.hands_to >= 0:  # Rule 2a
                self.backend.pass_backward(a)
            if a.frees_graph:  # Rule 5
                self.handles.pop(key, None)
                self.backend.release(a.stage, a.microbatch)
        elif op in ("recv_f", "recv_b"):  # Rule 7
            self._post(a)
        elif op in ("send_f", "send_b"):
            self.backend.send(a)
        elif op == "reduce_grad":  # Rule 8
            self.backend.reduce_grad(a)
            for param in self.scaled_at.get(a.stage, ()):
                if param.grad is not None:
                    param.grad.div_(self.grad_scale)
        elif op == "unshard":
            self.backend.unshard(a)
        elif op == "reshard":
            self.backend.reshard(a)

    def _verb(self, a: Action) -> str:
        """What backward ``a`` runs (Rule 4)."""
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
        """Posts the receives ``a`` lists, in order (Rule 7); forward ones alone under Rule 13."""
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
        """Forward ``a`` ran one checkpoint per region of ``session``, which replays in pieces (Rule 3a)."""
        handles, regions = self.handles[(a.stage, a.microbatch)], self.plan_sessions[session]["regions"]
        if len(handles) != len(regions):
            raise RunError(f"{self.runtime}: rank {self.rank} action {self.pc} ({a.describe()}): ran {len(handles)} "
                           f"checkpoints, but its session {session} replays in pieces by its {len(regions)} regions "
                           f"({', '.join(regions)}); a replay in pieces needs one checkpoint per planned region, in "
                           f"forward order (NOTE [ Executing a plan ] Rule 3a)")

    def _piece_of(self, a: Action) -> List[RecomputeHandle]:
        """The handles of piece ``a``'s regions (Rule 3a; their count was checked at the forward)."""
        handles = self._handles_of(a)
        return [handles[i] for i in a.regions]

    def abandon(self) -> None:
        """After an error: no replayed tensor outlives the step (Rule 9)."""
        self.scope.clear_all()

    def finish(self) -> List[object]:
        """Ends the step (Rule 9); returns the ids of the sessions the plan left open."""
        self.backend.flush()
        if self.posted:
            unread = ", ".join(f"{a.describe()}" for a in self.posted.values())
            self.abandon()
            raise RunError(f"{self.runtime}: rank {self.rank}: received but never read: {unread}")
        return list(self.scope.clear_all())


def run_step(interpreters: Sequence[PlanInterpreter]) -> List[object]:
    """One step of each interpreter's rank, in this process (Rule 9); returns the sessions the
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
