"""The runtimes' admission check (``hp_recompute.plan.verify``: the C++ verifier through the bindings)
on a catalogue of hand-broken plans.

Each case edits a real plan (ZBV, 2 ranks, 4 microbatches, the bundled GPT's costs) the
way a hand edit or a bad tool would, and must be refused naming what is wrong; the
unbroken plan passes. ``hp-recompute-plan --verify`` refuses it with the same lines, and
the runner refuses it before starting any rank (exit 1, in seconds).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from hp_recompute.plan import RunError, admit_plan, plan_problems
from hpr_run_util import GPT_MODEL_JSON, PLAN_TOOL, REPO, make_plan, run_cli

sys.path.insert(0, str(REPO / "test" / "python" / "plan"))
from hand_plan import hand_plan  # noqa: E402

Plan = Dict[str, Any]


@pytest.fixture(scope="module")
def zbv_plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    path = make_plan(tmp_path_factory.mktemp("plan"), "--schedule-gen", "zbv", "--ranks", "2", "--microbatches",
                     "4", "--model", str(GPT_MODEL_JSON))
    return json.loads(path.read_text())


def _index(actions: List[Dict[str, Any]], op: str, nth: int = 0) -> int:
    return [i for i, a in enumerate(actions) if a["op"] == op][nth]


def _drop(op: str, rank: int = 0) -> Callable[[Plan], None]:
    def edit(p: Plan) -> None:
        acts = p["ranks"][rank]["actions"]
        del acts[_index(acts, op)]
    return edit


def _session_on_wrong_rank(p: Plan) -> None:
    p["sessions"][0]["rank"] = 1 - p["sessions"][0]["rank"]


def _consumer_of_another_session(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    a = acts[_index(acts, "backward_input")]
    a["session"] = next(s["id"] for s in p["sessions"] if s["id"] != a["session"] and s["rank"] == 0)


def _duplicate_forward(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    i = _index(acts, "forward")
    acts.insert(i + 1, copy.deepcopy(acts[i]))


def _send_to_own_rank(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    acts[_index(acts, "send_f")]["peer"] = 0


def _receive_before_anyone_can_send(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    acts.insert(0, acts.pop(_index(acts, "recv_b")))  # waits for a gradient of a forward it has not sent


def _weight_before_input(p: Plan) -> None:
    acts = p["ranks"][1]["actions"]
    i, w = _index(acts, "backward_input"), _index(acts, "backward_weight")
    acts[i], acts[w] = acts[w], acts[i]


def _graph_freed_by_dx(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    acts[_index(acts, "backward_input")]["frees_graph"] = True


def _tag_mismatch(p: Plan) -> None:
    acts = p["ranks"][1]["actions"]
    acts[_index(acts, "recv_f")]["tag"] += 1


def _keeping_posts(edit: Callable[[Plan], None]) -> Callable[[Plan], None]:
    """``edit``, after which every ``posts`` and ``waits`` names the same receives as before (by index, so an edit
    that moves, adds or drops actions would otherwise break them too): the edit plants one bug only."""
    def wrapped(p: Plan) -> None:
        named = [[(a, key, [acts[i] for i in a[key]], list(a[key])) for a in acts for key in ("posts", "waits")
                  if key in a] for acts in (r["actions"] for r in p["ranks"])]
        edit(p)
        for rank, pairs in zip(p["ranks"], named):
            where = {id(a): i for i, a in enumerate(rank["actions"])}
            for a, key, targets, was in pairs:
                if a.get(key) == was:  # the edit left it: keep it naming the same receives
                    a[key] = [where[id(t)] for t in targets if id(t) in where]
    return wrapped


CATALOGUE = {
    "graph freed by the dx": (_graph_freed_by_dx, "frees_graph must mark the last backward"),
    "tags disagree": (_tag_mismatch, "differs from tag"),
    "missing recompute": (_drop("recompute"), "which is never recomputed before it"),
    "missing clear": (_drop("clear"), "is never cleared: its recomputed tensors leak"),
    "missing dw": (_drop("backward_weight", rank=1), "dx without dw"),
    "missing forward": (_drop("forward", rank=1), "names session s1.mb0 before rank 1 binds it"),
    "session on the wrong rank": (_session_on_wrong_rank, "but stage 0 runs on rank 0"),
    "consumer bound to another session": (_consumer_of_another_session, "not to this action's stage"),
    "duplicated forward": (_duplicate_forward, "second forward of stage 0, microbatch 0"),
    "receive without a send": (_drop("send_f", rank=0), "no SEND_F after it"),
    "send without a receive": (_drop("recv_f", rank=1), "no RECV_F before it"),
    "send to its own rank": (_send_to_own_rank, "peer 0, but stage 1 runs on rank 1"),
    "deadlock": (_receive_before_anyone_can_send, "deadlock"),
    "dw before dx": (_weight_before_input, "dw before its dx"),
}


def _first(p: Plan, rank: int, pred: Callable[[Dict[str, Any]], bool]) -> int:
    return next(i for i, a in enumerate(p["ranks"][rank]["actions"]) if pred(a))


def _last_backward(acts: List[Dict[str, Any]], stage: int) -> int:
    return max(i for i, a in enumerate(acts) if a["op"] in ("backward_weight", "backward") and a["stage"] == stage)


def _reduce_before_last_w(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    stage = acts[0]["stage"]
    acts[:] = [a for a in acts if not (a["op"] == "reduce_grad" and a["stage"] == stage)]
    acts.insert(_last_backward(acts, stage), {"op": "reduce_grad", "stage": stage})


def _reduce_twice(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    stage = acts[0]["stage"]
    acts[:] = [a for a in acts if not (a["op"] == "reduce_grad" and a["stage"] == stage)]
    acts += [{"op": "reduce_grad", "stage": stage}, {"op": "reduce_grad", "stage": stage}]


def _no_reduce_grad(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    stage = acts[0]["stage"]
    acts[:] = [a for a in acts if not (a["op"] == "reduce_grad" and a["stage"] == stage)]


def _self_posting(acts: List[Dict[str, Any]]) -> List[int]:
    """The receives that post only themselves (a receive whose peer sends it first), by index."""
    return [i for i, a in enumerate(acts) if a.get("posts") == [i]]


def _posted_twice(p: Plan) -> None:
    """Rank 1's second receive posts its first receive again."""
    acts = p["ranks"][1]["actions"]
    first, second = _self_posting(acts)[:2]
    acts[second]["posts"].append(first)


def _posted_out_of_order(p: Plan) -> None:
    """Rank 1's first receive posts its second one's message first: untagged messages would cross."""
    acts = p["ranks"][1]["actions"]
    first, second = _self_posting(acts)[:2]
    acts[first]["posts"], acts[second]["posts"] = [second, first], []


def _duplicate_tag(p: Plan) -> None:
    """Rank 0's second send to its peer takes the first one's tag, at both ends."""
    sends = [a for a in p["ranks"][0]["actions"] if a["op"] == "send_f"]
    first, second = sends[0], next(a for a in sends[1:] if a["peer"] == sends[0]["peer"])
    recv = next(a for a in p["ranks"][first["peer"]]["actions"]
                if a["op"] == "recv_f" and a["peer"] == 0 and a["tag"] == second["tag"])
    second["tag"] = recv["tag"] = first["tag"]


def _send_before_its_forward(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    send = acts.pop(_first(p, 0, lambda a: a["op"] == "send_f"))
    acts.insert(_first(p, 0, lambda a: a["op"] == "forward" and a["stage"] == send["stage"]
                       and a["microbatch"] == send["microbatch"]), send)


def _receive_after_its_forward(p: Plan) -> None:
    acts = p["ranks"][1]["actions"]
    recv = acts.pop(_first(p, 1, lambda a: a["op"] == "recv_f"))
    use = _first(p, 1, lambda a: a["op"] == "forward" and a["stage"] == recv["stage"]
                 and a["microbatch"] == recv["microbatch"])
    acts.insert(use + 1, recv)


def _retain_on_the_last_consumer(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    acts[_first(p, 0, lambda a: a["op"] == "backward_weight" and "session" in a)]["retain_on_unpack"] = True


def _release_before_the_last_consumer(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    acts[_first(p, 0, lambda a: a["op"] == "backward_input" and "session" in a)]["retain_on_unpack"] = False


#: The rules a hostile trial found missing (REDUCE_GRAD, tags, data flow, retain flags), and those of what the
#: planner lowers into the plan (a REDUCE_GRAD per stage, when each receive is posted); each edit works on any
#: plan with a dx/dw split on rank 0 and two receives from rank 0 on rank 1.
FOUND_MISSING = {
    "reduce_grad before the last W": (_reduce_before_last_w, "the last W or B of stage 0; gradients are reduced "
                                                             "once per stage"),
    "reduce_grad twice": (_reduce_twice, "second REDUCE_GRAD of stage 0"),
    "duplicate tag": (_duplicate_tag, "is already used by rank 0"),
    "send before its forward": (_send_before_its_forward, "send before the action that produces it"),
    "receive after its forward": (_receive_after_its_forward, "receive after the action that needs it"),
    "retain on the last consumer": (_retain_on_the_last_consumer, "but sets retain_on_unpack"),
    "release before the last consumer": (_release_before_the_last_consumer, "does not set retain_on_unpack"),
    "no reduce_grad": (_no_reduce_grad, "no REDUCE_GRAD of stage 0 after this, its last W or B; a plan reduces each "
                                        "stage's gradients exactly once, after its last W and B "
                                        "[hpr.schedule.reduce-grad]"),
}
def _no_last_backward(p: Plan) -> None:
    acts = p["ranks"][0]["actions"]
    del acts[_last_backward(acts, acts[0]["stage"])]["last_backward"]


def _last_backward_on_an_earlier_backward(p: Plan) -> None:
    """Rank 0's first W or B of its first stage says it is the stage's last."""
    acts = p["ranks"][0]["actions"]
    stage = acts[0]["stage"]
    acts[_first(p, 0, lambda a: a["op"] in ("backward_weight", "backward") and a["stage"] == stage)][
        "last_backward"] = True


def _readers(acts: List[Dict[str, Any]]) -> List[int]:
    return [i for i, a in enumerate(acts) if a.get("waits")]


def _reader_does_not_wait(p: Plan) -> None:
    acts = p["ranks"][1]["actions"]
    del acts[_readers(acts)[0]]["waits"]


def _reader_waits_for_anothers_receive(p: Plan) -> None:
    """Rank 1's first two readers wait for each other's receive."""
    acts = p["ranks"][1]["actions"]
    first, second = _readers(acts)[:2]
    acts[first]["waits"], acts[second]["waits"] = acts[second]["waits"], acts[first]["waits"]


def _hands_to_another_rank(p: Plan) -> None:
    """Stage 0's first forward hands its output to stage 1, which runs on rank 1."""
    acts = p["ranks"][0]["actions"]
    acts[_first(p, 0, lambda a: a["op"] == "forward" and a["stage"] == 0)]["hands_to"] = 1


FOUND_MISSING.update({
    "no last_backward": (_no_last_backward, "no last_backward on the last backward_weight or backward of stage 0; a "
                                            "plan marks it, where the stage's gradients are complete "
                                            "[hpr.plan.last-backward]"),
    "last_backward on an earlier backward": (_last_backward_on_an_earlier_backward,
                                             "last_backward marks that one only [hpr.plan.last-backward]"),
    "a reader that does not wait": (_reader_does_not_wait, "but does not list it in waits; an action waits for each "
                                                           "receive it reads [hpr.plan.waits]"),
    "a reader waiting for another's receive": (_reader_waits_for_anothers_receive,
                                               "an action waits for the receives it reads, and only those "
                                               "[hpr.plan.waits]"),
    "hands_to another rank": (_hands_to_another_rank, "hands_to 1, but stage 1 runs on rank 1; a transfer carries its "
                                                      "output, hands_to names a stage on the same rank "
                                                      "[hpr.plan.hands-to]"),
})
# Edits that move, add or drop actions keep the receives' posts pointing at the same receives.
CATALOGUE = {case: (_keeping_posts(edit), message) for case, (edit, message) in CATALOGUE.items()}
FOUND_MISSING = {case: (_keeping_posts(edit), message) for case, (edit, message) in FOUND_MISSING.items()}
FOUND_MISSING.update({
    "a receive posted twice": (_posted_twice, "posts it first); each receive is posted once [hpr.schedule.posts]"),
    "receives posted out of the peer's order": (_posted_out_of_order, "but rank 0 sends its message first; receives "
                                                "from one peer are posted in the order it sends, since untagged "
                                                "messages match in posting order [hpr.schedule.posts]"),
})
SOURCES = ["hand"] + (["zbv"] if PLAN_TOOL.exists() else [])


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", sorted(FOUND_MISSING))
def test_a_rule_the_trial_found_missing_is_enforced(request: pytest.FixtureRequest, source: str, case: str) -> None:
    plan = hand_plan() if source == "hand" else copy.deepcopy(request.getfixturevalue("zbv_plan"))
    admit_plan(copy.deepcopy(plan), "p.json")  # the unbroken plan passes
    edit, message = FOUND_MISSING[case]
    edit(plan)
    with pytest.raises(RunError) as info:
        admit_plan(plan, "p.json")
    assert message in str(info.value)
    assert str(info.value).startswith("hp_recompute: plan p.json is refused before any rank runs")


def _no_hands_to(p: Plan) -> None:
    acts = p["ranks"][1]["actions"]
    del acts[_first(p, 1, lambda a: "hands_to" in a)]["hands_to"]


#: The in-memory handoff between co-located stages ([hpr.plan.hands-to]): only a V-shaped plan has one.
CO_LOCATED = {
    "no hands_to": (_no_hands_to, "no hands_to, but stage 2, which takes its output, runs on this rank too; a plan "
                                  "names the stage an action hands its result to in memory [hpr.plan.hands-to]"),
}


@pytest.mark.parametrize("case", sorted(CO_LOCATED))
def test_a_co_located_handoff_the_plan_does_not_name_is_refused(zbv_plan: Plan, case: str) -> None:
    plan = copy.deepcopy(zbv_plan)
    edit, message = CO_LOCATED[case]
    edit(plan)
    with pytest.raises(RunError) as info:
        admit_plan(plan, "p.json")
    assert message in str(info.value)


def test_the_deadlock_check_matches_messages_by_tag_as_the_transfer_check_does() -> None:
    """A message whose two ends carry different tags is refused, never simulated as delivered."""
    plan = hand_plan()
    for a in plan["ranks"][0]["actions"] + plan["ranks"][1]["actions"]:
        if a["op"] in ("send_f", "recv_f") and a["microbatch"] == 0:
            a["tag"] = 40 if a["op"] == "send_f" else 41  # a message whose receive waits on another tag
    with pytest.raises(RunError, match="differs from tag 40 of its send"):
        admit_plan(plan, "p.json")


def test_the_unbroken_plan_passes(zbv_plan: Plan) -> None:
    admit_plan(copy.deepcopy(zbv_plan), "p.json")


@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_a_broken_plan_is_refused_naming_the_problem(zbv_plan: Plan, case: str) -> None:
    edit, message = CATALOGUE[case]
    plan = copy.deepcopy(zbv_plan)
    edit(plan)
    with pytest.raises(RunError) as info:
        admit_plan(plan, "p.json")
    assert message in str(info.value)
    assert str(info.value).startswith("hp_recompute: plan p.json is refused before any rank runs")


@pytest.mark.parametrize("case", ["receive without a send", "deadlock"])
def test_the_runner_refuses_before_any_rank_starts(tmp_path: Path, zbv_plan: Plan, case: str) -> None:
    edit, message = CATALOGUE[case]
    plan = copy.deepcopy(zbv_plan)
    edit(plan)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(plan))
    # A receive without a send would otherwise wait out the 600 s timeout, past the test's limit.
    proc = run_cli("--plan", str(path), "--timeout", "600", timeout=120)
    assert proc.returncode == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_an_untagged_plan_runs_in_one_process_and_is_refused_before_spawning_processes(tmp_path: Path,
                                                                                      zbv_plan: Plan) -> None:
    """The planner admits a plan whose transfers carry no tag (a torch CSV's); the runner's
    processes match messages by tag, so multi-process mode refuses it before any rank starts."""
    plan = copy.deepcopy(zbv_plan)
    for rank in plan["ranks"]:
        for a in rank["actions"]:
            a.pop("tag", None)
    assert not admit_plan(copy.deepcopy(plan), "p.json").tagged
    path = tmp_path / "untagged.json"
    path.write_text(json.dumps(plan))
    proc = run_cli("--plan", str(path), "--timeout", "120")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"hp_recompute.run: {path}: the runner's processes match messages by tag, and this plan's transfers " \
           f"carry none" in proc.stderr
    assert run_cli("--plan", str(path), "--single-process").returncode == 0


@pytest.mark.parametrize("case", ["duplicate tag", "reduce_grad before the last W", "retain on the last consumer",
                                  "no reduce_grad", "receives posted out of the peer's order", "no last_backward",
                                  "a reader that does not wait", "no hands_to"])
def test_the_runner_refuses_a_rule_the_trial_found_missing(tmp_path: Path, zbv_plan: Plan, case: str) -> None:
    edit, message = {**FOUND_MISSING, **CO_LOCATED}[case]
    plan = copy.deepcopy(zbv_plan)
    edit(plan)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(plan))
    proc = run_cli("--plan", str(path), "--timeout", "120")
    assert proc.returncode == 1
    assert f"hp_recompute: plan {path} is refused before any rank runs" in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not PLAN_TOOL.exists(), reason="hp-recompute-plan is not built")
@pytest.mark.parametrize("case", sorted(CATALOGUE) + sorted(FOUND_MISSING) + sorted(CO_LOCATED))
def test_the_cli_verifier_names_the_same_rule(tmp_path: Path, zbv_plan: Plan, case: str) -> None:
    """One verifier: ``hp-recompute-plan --verify`` prints exactly the lines the runtimes refuse with."""
    edit, message = {**CATALOGUE, **FOUND_MISSING, **CO_LOCATED}[case]
    plan = copy.deepcopy(zbv_plan)
    edit(plan)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(plan))
    proc = subprocess.run([str(PLAN_TOOL), "--verify", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    cli_lines = [line.replace("hp-recompute-plan: error: ", "") for line in proc.stderr.splitlines()]
    assert any(message in line for line in cli_lines)
    runtime_lines = [line for problem in plan_problems(json.dumps(plan), str(path)) for line in problem.splitlines()]
    assert cli_lines == [line.replace("hp_recompute: error: ", "") for line in runtime_lines]
