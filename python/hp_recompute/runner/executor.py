"""The runner's stages: a ``StageBackend`` of the plan interpreter over a ``PipelineModel``.

Why: the interpreter (``plan/interpreter.py``, NOTE [ Executing a plan ]) says what each
action means; this says what it does to the runner's stages. Per (stage, microbatch)
the executor keeps the stage input (a detached leaf), the output and, between I and W,
the gradients W needs (docs/runner.md):

====================  =====================================================================
``forward``           stage units in order; plan regions with ``checkpoint: true`` go
                      through ``hp_recompute.checkpoint`` (``native``: torch's checkpoint)
backward ``dx``       ``backward_split.backward_input``: dx, and the gradients W needs
backward ``dw``       ``backward_split.backward_weight``: dW from those, into ``.grad``
backward ``whole``    ``autograd.grad(out, [x] + params, g)``: both in one call
backward ``none``     nothing (the first stage's dx: W is its whole backward)
``send_*``/``recv_*`` the transport (in memory, or torch.distributed point-to-point)
others                no-op (``unshard``, ``reshard``, ``reduce_grad``: no data parallelism;
                      the interpreter scales the gradients after ``reduce_grad``)
====================  =====================================================================

A stage whose neighbour lives on the same rank hands its tensor over in memory (the
plan has no transfer there, V-shape schedules).
"""

from __future__ import annotations

import functools
import os
import signal
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint as torch_checkpoint

from ..backward_split import WeightGradState, accumulate_grad, backward_input, backward_weight
from ..checkpoint import checkpoint as hr_checkpoint
from ..errors import RunError
from ..native import planner_extension
from ..plan.interpreter import StageBackend, forwards_are_plain
from ..plan.reader import Action, Plan
from ..replay_buffers import BufferKeepingFunction, ChangedBuffers
from .model import PipelineModel, StageSpec, Unit
from ..sessions import SessionScope

__all__ = ["Transport", "MemoryTransport", "RankExecutor", "planted_failure", "MODES"]

#: Checkpoint modes: the plan's sessions, torch.utils.checkpoint per backward call, none.
MODES = ("plan", "native", "none")

Key = Tuple[int, int]


#: What ``HPR_RUN_FAIL_AT``'s third field sends the rank's own process (``planted_failure``).
PLANTED_SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def planted_failure() -> Optional[Tuple[int, int, Optional[int]]]:
    """The test hook ``HPR_RUN_FAIL_AT="RANK:ACTION_INDEX[:kill|:stop]"``: that action raises, or
    the rank's process sends itself SIGKILL (no cleanup, no result) or SIGSTOP (it stops
    there, as under a debugger). Returns (rank, action index, signal or None)."""
    text = os.environ.get("HPR_RUN_FAIL_AT", "").strip()
    if not text:
        return None
    parts = text.split(":")
    if (len(parts) not in (2, 3) or not parts[0].isdigit() or not parts[1].isdigit()
            or not all(p in PLANTED_SIGNALS for p in parts[2:])):
        raise RunError(f"hp_recompute.run: HPR_RUN_FAIL_AT: expected 'RANK:ACTION_INDEX', 'RANK:ACTION_INDEX:kill' "
                       f"or 'RANK:ACTION_INDEX:stop', got '{text}'")
    return int(parts[0]), int(parts[1]), PLANTED_SIGNALS[parts[2]] if len(parts) == 3 else None


class Transport:
    """Moves boundary tensors between ranks; ``stage`` is always the *sending* stage."""

    def ready(self, kind: str, stage: int, mb: int, src: int, dst: int) -> bool:
        """Whether a receive can complete now without waiting (in-memory scheduling)."""
        return True

    def send(self, kind: str, stage: int, mb: int, src: int, dst: int, tensor: torch.Tensor, tag: int) -> None:
        """``tag`` is the plan's message tag (the same at both ends)."""
        raise NotImplementedError

    def post(self, kind: str, stage: int, mb: int, src: int, dst: int, tag: int) -> None:
        """Posts a receive: its buffer exists from here on (the plan's memory model counts it
        from the ``recv`` action); ``recv`` waits for it. Default: ``recv`` does both."""

    def recv(self, kind: str, stage: int, mb: int, src: int, dst: int, tag: int) -> torch.Tensor:
        raise NotImplementedError

    def flush(self) -> None:
        """Waits for every send of this rank to complete (end of a step)."""


class MemoryTransport(Transport):
    """Single-process handoff: a send stores a clone, the matching receive takes it."""

    def __init__(self) -> None:
        self.box: Dict[Tuple[str, int, int, int, int], torch.Tensor] = {}

    def ready(self, kind: str, stage: int, mb: int, src: int, dst: int) -> bool:
        return (kind, stage, mb, src, dst) in self.box

    def send(self, kind: str, stage: int, mb: int, src: int, dst: int, tensor: torch.Tensor, tag: int) -> None:
        key = (kind, stage, mb, src, dst)
        if key in self.box:
            raise RunError(f"hp_recompute.run: rank {src} sends {kind} of stage {stage} mb {mb} twice")
        self.box[key] = tensor.detach().clone()

    def recv(self, kind: str, stage: int, mb: int, src: int, dst: int, tag: int) -> torch.Tensor:
        return self.box.pop((kind, stage, mb, src, dst))


class _Micro:
    """State of one (stage, microbatch) between its forward and its last backward."""

    __slots__ = ("x", "out", "batch", "weights")

    def __init__(self, x: Any, out: torch.Tensor, batch: Any) -> None:
        self.x, self.out, self.batch = x, out, batch
        self.weights: Optional[WeightGradState] = None  # between backward_input and backward_weight


class RankExecutor(StageBackend):
    """The runner's backend: runs one rank's stages of a ``PipelineModel`` for one step at a time.

    The plan's actions are interpreted by ``PlanInterpreter`` (NOTE [ Executing a plan ];
    ``steps.StepDriver`` pairs the two); this class says what a forward, a backward verb and
    a transfer are for the runner's stages. A receive is posted where the plan's ``posts`` say
    and waited for by its reader; messages carry the plan's tags, so no posting order can
    mismatch them.

    Args:
        rank: this rank.
        plan: the plan.
        specs: every stage's spec (only this rank's are run).
        model: the model whose parameters this rank's stages use.
        transport: how boundary tensors travel.
        mode: ``plan`` (sessions), ``native`` (torch.utils.checkpoint) or ``none``.
    """

    def __init__(self, rank: int, plan: Plan, specs: Sequence[StageSpec], model: PipelineModel,
                 transport: Transport, mode: str = "plan", sessions: Optional[SessionScope] = None) -> None:
        if mode not in MODES:
            raise RunError(f"hp_recompute.run: unknown checkpoint mode '{mode}'; expected one of {', '.join(MODES)}")
        self.rank, self.plan, self.specs, self.model, self.transport, self.mode = rank, plan, specs, model, transport, mode
        #: the rank's recompute sessions: its own namespace, cleared by the runner after each step
        self.sessions = sessions if sessions is not None else SessionScope(f"hp_recompute.run rank {rank}")
        named = dict(model.module.named_parameters())
        #: per stage of this rank, its (name, parameter) pairs
        self.params = {s.stage: [(n, named[n]) for n in s.params]
                       for s in specs if plan.stage_to_rank[s.stage] == rank}
        self.param_names = [n for s in specs if plan.stage_to_rank[s.stage] == rank for n in s.params]
        self.fail_at = planted_failure()
        self.planner = planner_extension()
        self.buffers_changed_by: Dict[str, ChangedBuffers] = {}  # unit -> buffers its forward updates
        self.reset([], [])

    # -- step state ----------------------------------------------------------------------

    def reset(self, batches: List[Any], seeds: List[int]) -> None:
        """Starts a step on ``batches`` with their seeds (``reference.microbatch_seeds``)."""
        self.batches, self.seeds = batches, seeds
        self.micro: Dict[Key, _Micro] = {}
        self.inbox_f: Dict[Key, torch.Tensor] = {}
        self.inbox_b: Dict[Key, torch.Tensor] = {}
        self.dx_out: Dict[Key, torch.Tensor] = {}
        self.losses: Dict[int, torch.Tensor] = {}
        # native mode: calls of checkpointed units (forwards + replays) and forwards, this step
        self.native_calls = 0
        self.native_forwards = 0

    # -- the backend ---------------------------------------------------------------------

    def before(self, index: int, a: Action) -> None:
        if self.fail_at is not None and self.fail_at[:2] == (self.rank, index):
            if self.fail_at[2] is not None:
                os.kill(os.getpid(), self.fail_at[2])
            raise RuntimeError(f"planted failure (HPR_RUN_FAIL_AT={self.rank}:{index})")

    def send(self, a: Action) -> None:
        key = (a.stage, a.microbatch)
        if a.op == "send_f":
            self.transport.send("f", a.stage, a.microbatch, self.rank, a.peer, self._forward_of(a).out.detach(), a.tag)
            return
        if key not in self.dx_out:
            raise RunError(f"hp_recompute.run: rank {self.rank}: send_b of stage {a.stage} mb {a.microbatch} "
                           f"before its dx (backward_input or backward of that stage and microbatch)")
        self.transport.send("b", a.stage, a.microbatch, self.rank, a.peer, self.dx_out.pop(key), a.tag)

    def _message(self, a: Action) -> Tuple[str, int]:
        """A receive's (kind, sending stage)."""
        return a.op[-1], self.planner.neighbour_stage(a.op, a.stage)

    def post_recv(self, a: Action) -> None:
        kind, sender = self._message(a)
        self.transport.post(kind, sender, a.microbatch, a.peer, self.rank, a.tag)

    def recv_ready(self, a: Action) -> bool:
        kind, sender = self._message(a)
        return self.transport.ready(kind, sender, a.microbatch, a.peer, self.rank)

    def wait_recv(self, a: Action) -> None:
        kind, sender = self._message(a)
        inbox = self.inbox_f if kind == "f" else self.inbox_b
        inbox[(a.stage, a.microbatch)] = self.transport.recv(kind, sender, a.microbatch, a.peer, self.rank, a.tag)

    def flush(self) -> None:
        self.transport.flush()

    def release(self, stage: int, mb: int) -> None:
        self.micro.pop((stage, mb), None)
        self.inbox_b.pop((stage, mb), None)

    def _forward_of(self, a: Action) -> "_Micro":
        """The state a forward left for ``a``'s (stage, mb); a plan ordered wrongly is named."""
        m = self.micro.get((a.stage, a.microbatch))
        if m is None:
            raise RunError(f"hp_recompute.run: rank {self.rank}: {a.op} of stage {a.stage} mb {a.microbatch} "
                           f"before its forward or after its last backward")
        return m

    def _unit_call(self, unit: Unit, h: Any, batch: Any, seed: int) -> Any:
        fn: Any = functools.partial(unit.__call__, batch=batch, seed=seed)
        if not unit.checkpoint or forwards_are_plain() or self.mode == "none":
            return fn(h)
        # A replay leaves the buffers as the forward left them (docs/runner.md).
        fn = BufferKeepingFunction(fn, self.model.module, self.buffers_changed_by.setdefault(unit.name,
                                                                                              ChangedBuffers()))
        # A selective region's policy (NOTE [ Selective policy ]), in either mode.
        options = {} if unit.context_fn is None else {"context_fn": unit.context_fn}
        if self.mode == "plan":
            return hr_checkpoint(fn, h, **options)

        def counted(x: Any) -> Any:
            self.native_calls += 1
            return fn(x)

        self.native_forwards += 1
        return torch_checkpoint.checkpoint(counted, h, use_reentrant=False, **options)

    def forward(self, a: Action) -> torch.Tensor:
        s, mb = a.stage, a.microbatch
        batch = self.batches[mb]
        if s == 0:
            x = batch
        else:
            if (s, mb) not in self.inbox_f:
                raise RunError(f"hp_recompute.run: rank {self.rank}: forward of stage {s} mb {mb} has no input "
                               f"(no recv_f and stage {s - 1} did not run here first)")
            x = self.inbox_f.pop((s, mb)).detach().requires_grad_(True)
        h = x
        for unit in self.specs[s].units:
            h = self._unit_call(unit, h, batch, self.seeds[mb])
        self.micro[(s, mb)] = _Micro(x, h, batch)
        if s == self.plan.num_stages - 1:  # the step's loss: the microbatches' mean (reference.sum_losses)
            self.losses[mb] = h.detach() / self.plan.num_microbatches
        return h

    def pass_forward(self, a: Action, output: torch.Tensor) -> None:
        self.inbox_f[(a.hands_to, a.microbatch)] = output.detach()

    def pass_backward(self, a: Action) -> None:
        self.inbox_b[(a.hands_to, a.microbatch)] = self.dx_out.pop((a.stage, a.microbatch))

    def input_requires_grad(self, a: Action) -> bool:
        x = self._forward_of(a).x
        return isinstance(x, torch.Tensor) and x.requires_grad

    def stage_parameters(self, stage: int) -> List[torch.Tensor]:
        return [p for _, p in self.params[stage]]

    def backward(self, a: Action, verb: str, last: bool) -> None:
        """``verb`` of ``a`` (NOTE [ dx/dw split ] in backward_split.py for dx and dw)."""
        s, mb = a.stage, a.microbatch
        m = self._forward_of(a)
        if verb == "none":  # no input gradient; the whole backward at W reads what the forward left
            return
        grad_out = None
        if s != self.plan.num_stages - 1:
            if (s, mb) not in self.inbox_b:
                raise RunError(f"hp_recompute.run: rank {self.rank}: {a.op} of stage {s} mb {mb} has no output "
                               f"gradient (no recv_b and stage {s + 1} did not run its dx here first)")
            grad_out = self.inbox_b[(s, mb)]
        grads_out = None if grad_out is None else [grad_out]
        # The first stage's input gradient goes nowhere (the interpreter runs its dx as none).
        want_x = s > 0 and verb in ("dx", "whole") and self.input_requires_grad(a)
        trained = [(n, p) for n, p in self.params[s] if p.requires_grad]
        names, params = [n for n, _ in trained], [p for _, p in trained]
        keep = not a.frees_graph  # the plan's last backward of (stage, mb) frees its graph
        dx: Optional[torch.Tensor] = None
        wgrads: Sequence[Optional[torch.Tensor]] = ()
        if verb == "whole":
            # In place, as torch's stage backward: each weight gradient is added into .grad as the
            # backward reaches it (the planner prices a whole backward so, CostModel.h), not returned
            # at its end beside the activations it has not freed yet.
            before = [(p.grad, None if p.grad is None else p.grad._version) for p in params]
            if want_x:
                m.x.grad = None
            if params or want_x:
                torch.autograd.backward([m.out], grads_out, retain_graph=keep,
                                        inputs=([m.x] if want_x else []) + params)
            if want_x:
                dx, m.x.grad = m.x.grad, None
            # A weight the backward reached holds a new .grad, or the one it had, added into.
            unreached = [n for n, p, (grad, version) in zip(names, params, before)
                         if p.grad is grad and (grad is None or grad._version == version)]
            if unreached:  # never a None gradient silently (as hpr.split.no-silent-none)
                raise RunError(f"hp_recompute.run: rank {self.rank}: {a.op} of stage {s} mb {mb}: weights "
                               f"{', '.join(unreached)} are not reached by the stage's graph; no gradient")
        elif verb == "dx":
            dxs, m.weights = backward_input([m.out], grads_out, [m.x] if want_x else [], params,
                                            retain_graph=keep, names=names)
            dx = dxs[0] if want_x else None
        else:
            if m.weights is None:
                raise RunError(f"hp_recompute.run: rank {self.rank}: backward_weight of stage {s} mb {mb} has no "
                               f"backward_input before it")
            wgrads = backward_weight(m.weights, retain_graph=keep)
            m.weights = None
        if want_x:  # to send_b, or to the previous stage on this rank (pass_backward)
            self.dx_out[(s, mb)] = dx
        accumulate_grad(params, wgrads)
