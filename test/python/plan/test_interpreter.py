"""The plan interpreter both runtimes share (NOTE [ Executing a plan ] in plan/interpreter.py).

A backend here records what it is asked to do, so the tests read, action by action, what
the interpreter decided: which receives a ``recv`` posts and in which order, that the
reader of a receive waits for it, the in-memory handoff between co-located stages, the
"last backward" flag, and how an error or a left-over receive ends a step. The runtimes'
own tests (test/python/run, test/python/pipelining) run the same interpreter on real
stages.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch

import hp_recompute as hr
from hp_recompute.errors import RunError
from hp_recompute.plan.interpreter import PlanInterpreter, StageBackend, forwards_are_plain, run_step
from hp_recompute.plan.reader import Action, build_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hand_plan import hand_plan  # noqa: E402


class Recorder(StageBackend):
    """Records each call as (method, op, stage, mb)."""

    def __init__(self, fail_on: str = "") -> None:
        self.calls: List[Tuple[Any, ...]] = []
        self.fail_on = fail_on

    def _note(self, what: str, a: Action, *extra: Any) -> None:
        if what == self.fail_on:
            raise ValueError(f"{what} failed")
        self.calls.append((what, a.op, a.stage, a.microbatch, *extra))

    def forward(self, a: Action) -> Any:
        self._note("forward", a, forwards_are_plain())
        return f"out{a.stage}.{a.microbatch}"

    def pass_forward(self, a: Action, output: Any) -> None:
        self._note("pass_forward", a, output)

    def pass_backward(self, a: Action) -> None:
        self._note("pass_backward", a)

    def backward(self, a: Action, verb: str, last: bool) -> None:
        self._note("backward", a, verb, last)

    def send(self, a: Action) -> None:
        self._note("send", a)

    def post_recv(self, a: Action) -> None:
        self._note("post", a)

    def wait_recv(self, a: Action) -> None:
        self._note("wait", a)

    def reduce_grad(self, a: Action) -> None:
        self._note("reduce_grad", a)

    def unshard(self, a: Action) -> None:
        self._note("unshard", a)

    def wait_unshard(self, stage: int) -> None:
        self.calls.append(("wait_unshard", stage))

    def reshard(self, a: Action) -> None:
        self._note("reshard", a)


def _run(raw: Dict[str, Any], rank: int, backend: Recorder) -> PlanInterpreter:
    run = PlanInterpreter("test", build_plan(raw, "hand.json"), rank, backend, hr.SessionScope("test"),
                          sessions=False)
    assert run_step([run]) == []
    return run


def _compute_and_transfers(calls: List[Tuple[Any, ...]]) -> List[Tuple[Any, ...]]:
    return [c for c in calls if c[0] in ("post", "wait", "forward", "backward", "send", "reduce_grad")]


def _insert(actions: List[Dict[str, Any]], at: int, action: Dict[str, Any]) -> None:
    """Inserts ``action`` at index ``at`` of a rank's actions, renumbering posts and waits."""
    for other in actions:
        for key in ("posts", "waits"):
            if key in other:
                other[key] = [j + 1 if j >= at else j for j in other[key]]
    actions.insert(at, action)


def test_an_unshard_is_issued_ahead_and_waited_for_by_the_stages_next_reader():
    raw = hand_plan()
    actions = raw["ranks"][1]["actions"]
    _insert(actions, 0, {"op": "unshard", "stage": 1})
    _insert(actions, len(actions) - 1, {"op": "reshard", "stage": 1})
    backend = Recorder()
    _run(raw, 1, backend)
    calls = [c[:2] if c[0] != "wait_unshard" else c for c in backend.calls]
    # The gather is issued before the receive and waited for after it, right before the
    # first forward; every later reader and the reshard ask again (a no-op once waited).
    assert calls[:5] == [("unshard", "unshard"), ("post", "recv_f"), ("wait", "recv_f"), ("wait_unshard", 1),
                         ("forward", "forward")]
    readers = [i for i, c in enumerate(calls) if c[0] in ("forward", "backward", "reshard")]
    assert all(calls[i - 1] == ("wait_unshard", 1) for i in readers), calls
    assert [c for c in calls if c[0] == "wait_unshard"] == [("wait_unshard", 1)] * len(readers)


def test_a_receive_posts_and_its_reader_waits():
    backend = Recorder()
    _run(hand_plan(), 1, backend)
    assert _compute_and_transfers(backend.calls) == [
        ("post", "recv_f", 1, 0), ("wait", "recv_f", 1, 0), ("forward", "forward", 1, 0, False),
        ("backward", "backward", 1, 0, "whole", False), ("send", "send_b", 1, 0),
        ("post", "recv_f", 1, 1), ("wait", "recv_f", 1, 1), ("forward", "forward", 1, 1, False),
        ("backward", "backward", 1, 1, "whole", True), ("send", "send_b", 1, 1), ("reduce_grad", "reduce_grad", 1, -1)]


def test_receives_are_posted_in_the_order_posts_gives_not_the_order_they_are_read():
    """Rank 0 reads mb 1's gradient first; its peer sends mb 0's first: the first recv posts both."""
    raw = hand_plan()
    actions = raw["ranks"][0]["actions"]
    first, second = 4, 9  # recv_b mb 0, recv_b mb 1
    assert actions[first]["op"] == actions[second]["op"] == "recv_b"
    actions[first]["posts"], actions[second]["posts"] = [second, first], []
    backend = Recorder()
    _run(raw, 0, backend)
    transfers = [c for c in backend.calls if c[0] in ("post", "wait")]
    assert transfers == [("post", "recv_b", 0, 1), ("post", "recv_b", 0, 0), ("wait", "recv_b", 0, 0),
                         ("wait", "recv_b", 0, 1)]


def _one_rank(raw: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``raw`` with both stages on rank 0 and no transfers, forwards first; returns rank 0's actions."""
    raw["schedule"]["num_ranks"], raw["schedule"]["stage_to_rank"] = 1, [0, 0]
    raw["sessions"] = [{**s, "rank": 0} for s in raw["sessions"]]
    ops = [copy.deepcopy(a) for rank in raw["ranks"] for a in rank["actions"]
           if not a["op"].startswith(("send", "recv"))]
    for a in ops:
        a.pop("waits", None)
    order = sorted(range(len(ops)), key=lambda i: {"forward": 0}.get(ops[i]["op"], 1))
    raw["ranks"] = [{"rank": 0, "actions": [ops[i] for i in order]}]
    return raw["ranks"][0]["actions"]


def test_co_located_stages_hand_over_in_memory_where_the_plan_says():
    """One rank runs both stages: the plan has no transfer, and its hands_to say which results move."""
    raw = hand_plan()
    actions = _one_rank(raw)
    for a in actions:
        if (a["op"], a["stage"]) in (("forward", 0), ("backward", 1)):
            a["hands_to"] = 1 - a["stage"]
    backend = Recorder()
    _run(raw, 0, backend)
    handoffs = [c for c in backend.calls if c[0].startswith("pass")]
    assert handoffs == [("pass_forward", "forward", 0, 0, "out0.0"), ("pass_forward", "forward", 0, 1, "out0.1"),
                        ("pass_backward", "backward", 1, 0), ("pass_backward", "backward", 1, 1)]
    # Without hands_to nothing is handed over: the interpreter derives no neighbour of its own.
    for a in actions:
        a.pop("hands_to", None)
    backend = Recorder()
    _run(raw, 0, backend)
    assert [c for c in backend.calls if c[0].startswith("pass")] == []


def test_the_last_backward_flag_is_the_plans():
    backend = Recorder()
    _run(hand_plan(), 0, backend)
    flags = [(c[1], c[3], c[5]) for c in backend.calls if c[0] == "backward"]
    assert flags == [("backward_input", 0, False), ("backward_weight", 0, False), ("backward", 1, True)]
    # Moved to the W, the flag goes with it (an edit the verifier refuses; the interpreter only follows).
    raw = hand_plan()
    actions = raw["ranks"][0]["actions"]
    del actions[11]["last_backward"]
    actions[7]["last_backward"] = True
    backend = Recorder()
    _run(raw, 0, backend)
    flags = [(c[1], c[3], c[5]) for c in backend.calls if c[0] == "backward"]
    assert flags == [("backward_input", 0, False), ("backward_weight", 0, True), ("backward", 1, False)]


def test_an_action_waits_for_exactly_the_receives_its_waits_lists():
    """The forward of mb 1 lists no receive and the backward lists it: the wait moves to the backward."""
    raw = hand_plan()
    actions = raw["ranks"][1]["actions"]
    assert (actions[5]["op"], actions[6]["op"], actions[5]["waits"]) == ("forward", "backward", [4])
    actions[6]["waits"] = actions[5].pop("waits")
    backend = Recorder()
    _run(raw, 1, backend)
    assert _compute_and_transfers(backend.calls)[5:8] == [
        ("post", "recv_f", 1, 1), ("forward", "forward", 1, 1, False), ("wait", "recv_f", 1, 1)]


class NotYet(Recorder):
    """A transport where the message of receive ``pending`` (an action index) has not arrived."""

    def __init__(self, program: List[Action], pending: int) -> None:
        super().__init__()
        self.pending = program[pending]

    def recv_ready(self, a: Action) -> bool:
        return a is not self.pending


def test_ready_asks_the_transport_about_the_receives_waits_lists():
    plan = build_plan(hand_plan(), "hand.json")
    run = PlanInterpreter("test", plan, 1, NotYet(plan.ranks[1], 4), hr.SessionScope("ready"), sessions=False)
    readiness = []
    while not run.done:
        readiness.append((run.pc, run.ready()))
        run.step_one()
    # Only the forward of mb 1 (action 5) reads receive 4.
    assert [pc for pc, ready in readiness if not ready] == [5]


def test_a_plain_forward_runs_inside_plain_forwards():
    raw = hand_plan()
    raw["sessions"] = [s for s in raw["sessions"] if s["microbatch"] != 1]
    actions = raw["ranks"][0]["actions"]
    actions[2]["checkpoint"] = False  # forward stage 0 mb 1
    raw["ranks"][0]["actions"] = [a for a in actions if a["op"] not in ("recompute", "clear")
                                  or a["session"] != "s0.mb1"]
    for a in raw["ranks"][0]["actions"]:
        if a["op"] == "backward" and a["stage"] == 0:
            a.pop("session", None), a.pop("retain_on_unpack", None)
    # the removed recompute/clear shifted indices: posts point at the receives where they now stand
    for i, a in enumerate(raw["ranks"][0]["actions"]):
        if a["op"] == "recv_b":
            a["posts"] = [i]
    backend = Recorder()
    _run(raw, 0, backend)
    assert [c[4] for c in backend.calls if c[0] == "forward"] == [False, True]


def test_an_error_names_the_runtime_rank_and_action_and_clears_the_sessions():
    scope = hr.SessionScope("failing")
    run = PlanInterpreter("test", build_plan(hand_plan(), "hand.json"), 0, Recorder(fail_on="backward"), scope)
    x = torch.ones(2, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(torch.sin, x)
    scope.recompute_handle(handles[0], "left")  # a session the step leaves open
    with pytest.raises(RunError, match=r"^test: rank 0 action 6 \(backward_input stage 0 mb 0 session s0.mb0\): "
                                       r"ValueError: backward failed"):
        run_step([run])
    assert scope.live_sessions() == []  # abandoned: the failed backward's session and the one left open
    del y


def test_a_receive_posted_and_never_read_ends_the_step_with_an_error():
    raw = hand_plan()
    actions = raw["ranks"][1]["actions"]
    actions[0]["posts"] = [0, 4]  # mb 1's receive posted twice over: its own recv posts it again
    actions[4]["posts"] = []
    del actions[5:7]  # nobody reads mb 1's input
    actions[-2]["op"] = "idle"  # its send_b has no dx
    for key in ("stage", "microbatch", "peer", "tag"):
        actions[-2].pop(key)
    run = PlanInterpreter("test", build_plan(raw, "hand.json"), 1, Recorder(), hr.SessionScope("unread"),
                          sessions=False)
    with pytest.raises(RunError, match=r"rank 1: received but never read: recv_f stage 1 mb 1 peer 0"):
        run_step([run])


class TwoRegions(StageBackend):
    """Stage 0 of ``hand_plan`` as two real checkpointed regions, ``sin`` then ``cos``, on a
    weight; ``calls`` counts each region's calls (forward and replays). ``extra`` more
    checkpoints per forward model a stage whose forward does not match its planned regions."""

    def __init__(self, extra: int = 0) -> None:
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4))
        self.inputs = {mb: (torch.linspace(-1, 1, 4) + mb).requires_grad_() for mb in range(2)}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.calls = {"sin": 0, "cos": 0}
        self.extra = extra

    def _region(self, name: str):
        def run(x: torch.Tensor) -> torch.Tensor:
            self.calls[name] += 1
            return getattr(torch, name)(x * self.weight)
        return run

    def forward(self, a: Action) -> Any:
        x = self.inputs[a.microbatch]
        y = hr.checkpoint(self._region("cos"), hr.checkpoint(self._region("sin"), x))
        for _ in range(self.extra):
            y = hr.checkpoint(torch.exp, y)
        self.outputs[a.microbatch] = y
        return y

    def backward(self, a: Action, verb: str, last: bool) -> None:
        out, x = self.outputs[a.microbatch].sum(), self.inputs[a.microbatch]
        if verb == "dx":
            x.grad = torch.autograd.grad(out, [x], retain_graph=True)[0]
        elif verb == "dw":
            torch.autograd.backward(out, inputs=[self.weight])
        elif verb == "whole":
            out.backward()

    def send(self, a: Action) -> None:
        pass

    def wait_recv(self, a: Action) -> None:
        pass


def _pieces_plan() -> Dict[str, Any]:
    """``hand_plan`` with two checkpointed regions on stage 0, and microbatch 1's replay in
    pieces: its last region prefetched before its gradient arrives, the first inside its B."""
    raw = hand_plan()
    region = raw["model"]["stages"][0]["regions"][0]
    raw["model"]["stages"][0]["regions"] = [{**region, "name": "sin"}, {**region, "name": "cos"}]
    for session in raw["sessions"]:
        session["regions"] = ["sin", "cos"]
    actions = raw["ranks"][0]["actions"]
    actions[10].update(in_backward=True, regions=[0])  # recompute s0.mb1, before its B
    actions.insert(9, {"op": "recompute", "stage": 0, "microbatch": 1, "session": "s0.mb1", "regions": [1]})
    actions[10]["posts"] = [10]  # recv_b mb 1, moved by the insert
    actions[12]["waits"] = [10]
    return raw


def test_a_replay_in_pieces_prefetches_its_regions_and_the_backward_replays_the_rest():
    """hpr.exec.replay-in-pieces: the piece replays only the region it lists; the backward then replays the other
    one inside and reads the prefetched one without replaying it: one replay per region, and
    the gradients are the plain ones."""
    backend = TwoRegions()
    scope = hr.SessionScope("pieces")
    run = PlanInterpreter("test", build_plan(_pieces_plan(), "hand.json"), 0, backend, scope)
    seen = []
    while not run.done:
        a = run.program[run.pc]
        run.step_one()
        if a.session == "s0.mb1" and a.op in ("recompute", "backward"):
            seen.append((a.op, a.regions, dict(backend.calls)))
    assert run.finish() == []
    # forwards: sin 2, cos 2; mb 0's whole replay: 1 each; then mb 1's pieces
    assert seen == [("recompute", (1,), {"sin": 3, "cos": 4}),
                    ("recompute", (0,), {"sin": 3, "cos": 4}),
                    ("backward", (), {"sin": 4, "cos": 4})]
    assert [t[0] for t in run.action_s].count("recompute_piece") == 1
    weight = backend.weight.detach().clone().requires_grad_()
    for mb in range(2):  # mb 0's I and W, then mb 1's B, as the plan runs them
        x = (torch.linspace(-1, 1, 4) + mb).requires_grad_()
        torch.cos(torch.sin(x * weight) * weight).sum().backward()
        assert torch.equal(backend.inputs[mb].grad, x.grad)
    assert torch.equal(backend.weight.grad, weight.grad)


def test_a_forward_that_ran_other_checkpoints_than_its_pieces_name_is_refused_at_the_forward():
    """Pieces name regions by their place among the forward's checkpoints: a forward that ran
    more checkpoints than its session has regions cannot be mapped, and is refused right after
    it ran, before anything of its session replays."""
    backend = TwoRegions(extra=1)
    scope = hr.SessionScope("mismatch")
    plan = build_plan(_pieces_plan(), "hand.json")
    forward = next(i for i, a in enumerate(plan.ranks[0]) if a.op == "forward" and a.microbatch == 1)
    run = PlanInterpreter("test", plan, 0, backend, scope)
    with pytest.raises(RunError, match=rf"^test: rank 0 action {forward} \(forward stage 0 mb 1\): ran 3 "
                                       r"checkpoints, but its session s0.mb1 replays in pieces by its 2 regions "
                                       r"\(sin, cos\); a replay in pieces needs one checkpoint per planned region, "
                                       r"in forward order \[hpr\.exec\.replay-in-pieces\]$"):
        run_step([run])
    assert backend.calls == {"sin": 2, "cos": 2}  # the two forwards only: nothing replayed
    # Without sessions (hpr.exec.without-sessions: torch's checkpoint replays) the count does not matter.
    native = PlanInterpreter("test", plan, 0, TwoRegions(extra=1), hr.SessionScope("native"), sessions=False)
    assert run_step([native]) == []


class Verbs(Recorder):
    """A ``Recorder`` whose stages' inputs need a gradient or not (stages after frozen ones)."""

    def __init__(self, inputs_need_grad: bool = True) -> None:
        super().__init__()
        self.inputs_need_grad = inputs_need_grad

    def input_requires_grad(self, a: Action) -> bool:
        return self.inputs_need_grad


def _split_second_stage() -> Dict[str, Any]:
    """``hand_plan`` with stage 1's microbatch 0 run as I, then W after its send_b."""
    raw = hand_plan()
    actions = raw["ranks"][1]["actions"]
    actions[2] = {"op": "backward_input", "stage": 1, "microbatch": 0}
    _insert(actions, 4, {"op": "backward_weight", "stage": 1, "microbatch": 0, "frees_graph": True})
    return raw


@pytest.mark.parametrize("inputs_need_grad", [True, False])
def test_each_backward_is_one_verb_and_an_input_gradient_nobody_needs_is_none(inputs_need_grad):
    """hpr.exec.backward-verbs: a B is whole; an I is dx and its W dw, except the first stage's I and an I whose
    stage inputs need no gradient this microbatch: none, and then its W is the whole backward."""
    verbs = lambda backend: [(c[1], c[3], c[4]) for c in backend.calls if c[0] == "backward"]  # noqa: E731
    first = Verbs(inputs_need_grad)
    _run(hand_plan(), 0, first)
    assert verbs(first) == [("backward_input", 0, "none"), ("backward_weight", 0, "whole"), ("backward", 1, "whole")]
    second = Verbs(inputs_need_grad)
    _run(_split_second_stage(), 1, second)
    split = [("backward_input", 0, "dx"), ("backward_weight", 0, "dw")] if inputs_need_grad else \
        [("backward_input", 0, "none"), ("backward_weight", 0, "whole")]
    assert verbs(second) == split + [("backward", 1, "whole")]


class Gradients(Recorder):
    """Stages that hold parameters, one of them in both stages; each backward adds 1 to every
    gradient of its stage, and ``reduce_grad`` records the gradients it found."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = torch.nn.Parameter(torch.zeros(1))
        self.own = {0: torch.nn.Parameter(torch.zeros(1)), 1: torch.nn.Parameter(torch.zeros(1))}
        self.at_reduce: List[Tuple[int, float, float]] = []

    def stage_parameters(self, stage: int) -> List[torch.Tensor]:
        return [self.own[stage], self.shared]

    def backward(self, a: Action, verb: str, last: bool) -> None:
        for p in self.stage_parameters(a.stage):
            p.grad = torch.ones(1) if p.grad is None else p.grad + 1

    def reduce_grad(self, a: Action) -> None:
        self.at_reduce.append((a.stage, self.own[a.stage].grad.item(), self.shared.grad.item()))


def _one_rank_two_stages() -> Dict[str, Any]:
    """One rank holding both stages (a V shape's first rank), two microbatches, B only."""
    raw = hand_plan()
    actions = []
    for mb in range(2):
        actions += [{"op": "forward", "stage": 0, "microbatch": mb, "hands_to": 1},
                    {"op": "forward", "stage": 1, "microbatch": mb}]
    for mb in range(2):
        actions += [{"op": "backward", "stage": 1, "microbatch": mb, "frees_graph": True, "hands_to": 0,
                     "last_backward": mb == 1},
                    {"op": "backward", "stage": 0, "microbatch": mb, "frees_graph": True, "last_backward": mb == 1}]
    actions.insert(len(actions) - 1, {"op": "reduce_grad", "stage": 1})
    actions.append({"op": "reduce_grad", "stage": 0})
    raw["schedule"].update(num_ranks=1, stage_to_rank=[0, 0])
    raw["sessions"] = []
    raw["ranks"] = [{"rank": 0, "actions": actions}]
    return raw


def test_gradients_are_divided_once_each_at_the_last_reduce_grad_of_the_rank_that_holds_them():
    """hpr.exec.gradient-scaling: each parameter's gradient is divided by grad_scale once per step,
    after the data-parallel reduction; a parameter two stages of the rank hold waits for the later
    one (its gradient is not complete before), as torch's per-stage scale_grads would not."""
    backend = Gradients()
    run = PlanInterpreter("test", build_plan(_one_rank_two_stages(), "hand.json"), 0, backend,
                          hr.SessionScope("test"), sessions=False, grad_scale=4)
    assert run_step([run]) == []
    # stage 1's reduce_grad: its own 2 backwards; the shared one has 3 of its 4 gradients
    assert backend.at_reduce == [(1, 2.0, 3.0), (0, 2.0, 4.0)]
    assert (backend.own[1].grad.item(), backend.own[0].grad.item(), backend.shared.grad.item()) == (0.5, 0.5, 1.0)
    unscaled = Gradients()
    run = PlanInterpreter("test", build_plan(_one_rank_two_stages(), "hand.json"), 0, unscaled,
                          hr.SessionScope("test"), sessions=False)
    assert run_step([run]) == []
    assert unscaled.shared.grad.item() == 4.0


class NeverReady(Recorder):
    """A transport on which no message ever arrives."""

    def recv_ready(self, a: Action) -> bool:
        return False


def test_run_step_runs_ranks_until_none_can_go_on_and_names_where_each_waits():
    """hpr.exec.run-step: one process driving two ranks runs each as far as its receives allow; when no rank
    can go on the step is a deadlock, named rank by rank, and every rank's step is abandoned."""
    plan = build_plan(hand_plan(), "hand.json")
    scopes = [hr.SessionScope("rank0"), hr.SessionScope("rank1")]
    runs = [PlanInterpreter("test", plan, r, NeverReady(), scopes[r]) for r in range(2)]
    x = torch.ones(2, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(torch.sin, x)
    scopes[1].recompute_handle(handles[0], "open")
    with pytest.raises(RunError, match=r"^test: deadlock: every rank waits for a transfer: rank 0 at action 6 "
                                       r"\(backward_input stage 0 mb 0 session s0.mb0\); rank 1 at action 1 "
                                       r"\(forward stage 1 mb 0\)$"):
        run_step(runs)
    assert [run.pc for run in runs] == [6, 1]
    assert scopes[1].live_sessions() == []
    del y


class SplitRegions(TwoRegions):
    """Stage 1 of ``hand_plan`` as ``TwoRegions``' two checkpointed regions, its input needing a
    gradient, and its I and W hp_recompute's split (which releases after I what W does not read)."""

    def __init__(self) -> None:
        super().__init__()
        self.states: Dict[int, Any] = {}

    def backward(self, a: Action, verb: str, last: bool) -> None:
        from hp_recompute.backward_split import backward_input, backward_weight

        out, x = self.outputs[a.microbatch].sum(), self.inputs[a.microbatch]
        if verb == "dx":
            (x.grad,), self.states[a.microbatch] = backward_input([out], None, [x], [self.weight])
        elif verb == "dw":
            (grad,) = backward_weight(self.states.pop(a.microbatch))
            self.weight.grad = grad if self.weight.grad is None else self.weight.grad + grad
        else:
            super().backward(a, verb, last)


def _replayed_for_weight() -> Dict[str, Any]:
    """Rank 1 of ``hand_plan`` with stage 1 checkpointed: microbatch 0 runs I, drops its replay
    (``drops_replay``), and replays again for its W (``for_weight``) after its send_b; microbatch 1 a B."""
    raw = _split_second_stage()
    raw["model"]["stages"][1]["regions"] = [{**raw["model"]["stages"][0]["regions"][0], "name": n}
                                            for n in ("sin", "cos")]
    raw["sessions"] = [{"id": f"s1.mb{mb}", "stage": 1, "microbatch": mb, "rank": 1, "regions": ["sin", "cos"]}
                       for mb in range(2)]
    actions = raw["ranks"][1]["actions"]
    actions[2].update(session="s1.mb0", retain_on_unpack=True, drops_replay=True)
    actions[4].update(session="s1.mb0")
    _insert(actions, 2, {"op": "recompute", "stage": 1, "microbatch": 0, "session": "s1.mb0"})
    _insert(actions, 5, {"op": "recompute", "stage": 1, "microbatch": 0, "session": "s1.mb0", "for_weight": True})
    _insert(actions, 7, {"op": "clear", "stage": 1, "microbatch": 0, "session": "s1.mb0"})
    b1 = next(i for i, a in enumerate(actions) if a["op"] == "backward" and a["microbatch"] == 1)
    actions[b1]["session"] = "s1.mb1"
    _insert(actions, b1, {"op": "recompute", "stage": 1, "microbatch": 1, "session": "s1.mb1", "in_backward": True})
    _insert(actions, b1 + 2, {"op": "clear", "stage": 1, "microbatch": 1, "session": "s1.mb1"})
    return raw


def test_a_session_replayed_for_its_dw_drops_its_replay_after_the_dx_and_replays_again_before_the_dw():
    """hpr.exec.replay-for-weight: ``drops_replay`` leaves the session nothing after its dx, the ``for_weight``
    recompute replays both regions again before the dw, and the gradients are the plain ones."""
    backend = SplitRegions()
    scope = hr.SessionScope("for weight")
    plan = build_plan(_replayed_for_weight(), "hand.json")
    run = PlanInterpreter("test", plan, 1, backend, scope)
    seen = []
    while not run.done:
        a = run.program[run.pc]
        run.step_one()
        if a.session == "s1.mb0" and a.op != "clear":
            stats = scope.session_stats("s1.mb0")
            seen.append((a.op, a.for_weight, dict(backend.calls), stats["retained_tensors"] > 0))
    assert run.finish() == []
    # mb 0's forward, its replay, its I (nothing held after), its replay for W, its W (mb 1's forward comes later)
    assert seen == [("recompute", False, {"sin": 2, "cos": 2}, True),
                    ("backward_input", False, {"sin": 2, "cos": 2}, False),
                    ("recompute", True, {"sin": 3, "cos": 3}, True),
                    ("backward_weight", False, {"sin": 3, "cos": 3}, False)]
    weight = backend.weight.detach().clone().requires_grad_()
    for mb in range(2):
        x = (torch.linspace(-1, 1, 4) + mb).requires_grad_()
        torch.cos(torch.sin(x * weight) * weight).sum().backward()
        assert torch.equal(backend.inputs[mb].grad, x.grad)
    assert torch.equal(backend.weight.grad, weight.grad)
