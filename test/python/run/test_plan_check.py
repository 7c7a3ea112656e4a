"""The runtimes' admission check (``hp_recompute.plan.check``) on a catalogue of hand-broken plans.

Each case edits a real plan (ZBV, 2 ranks, 4 microbatches, the bundled GPT's costs) the
way a hand edit or a bad tool would, and must be refused naming what is wrong; the
unbroken plan passes. The runner refuses before starting any rank (exit 1, in seconds).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from hp_recompute.plan import validate_plan
from hp_recompute.plan import RunError, parse_plan
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


CATALOGUE = {
    "graph freed by the dx": (_graph_freed_by_dx, "frees_graph must mark the last backward"),
    "tags disagree": (_tag_mismatch, "no rank 1 receives it (with tag"),
    "missing recompute": (_drop("recompute"), "before its recompute"),
    "missing clear": (_drop("clear"), "has no clear of session"),
    "missing dw": (_drop("backward_weight", rank=1), "clears the session before its last backward"),
    "missing forward": (_drop("forward", rank=1), "runs before the forward"),
    "session on the wrong rank": (_session_on_wrong_rank, "but stage 0 runs on rank 0"),
    "consumer bound to another session": (_consumer_of_another_session, "which belongs to another stage"),
    "duplicated forward": (_duplicate_forward, "a second forward of stage 0 mb 0"),
    "receive without a send": (_drop("send_f", rank=0), "never sends it"),
    "send without a receive": (_drop("recv_f", rank=1), "no rank 1 receives it"),
    "send to its own rank": (_send_to_own_rank, "a transfer to or from its own rank"),
    "deadlock": (_receive_before_anyone_can_send, "deadlock: every remaining rank waits"),
    "dw before dx": (_weight_before_input, "backward_weight before its backward_input"),
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


#: Rules 2 (retain), 3a, 5 and 6 of plan/check.py; each edit works on any plan with a dx/dw split on rank 0.
FOUND_MISSING = {
    "reduce_grad before the last W": (_reduce_before_last_w, "the last backward of stage 0; gradients are "
                                                             "reduced once per stage"),
    "reduce_grad twice": (_reduce_twice, "a second reduce_grad of stage 0"),
    "duplicate tag": (_duplicate_tag, "is already used by action"),
    "send before its forward": (_send_before_its_forward, "a send must come after its producer"),
    "receive after its forward": (_receive_after_its_forward, "a receive must come before its consumer"),
    "retain on the last consumer": (_retain_on_the_last_consumer, "retain_on_unpack is true on the last consumer"),
    "release before the last consumer": (_release_before_the_last_consumer,
                                         "retain_on_unpack is false on a consumer of session"),
}
SOURCES = ["hand"] + (["zbv"] if PLAN_TOOL.exists() else [])


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", sorted(FOUND_MISSING))
def test_a_rule_the_trial_found_missing_is_enforced(request: pytest.FixtureRequest, source: str, case: str) -> None:
    plan = hand_plan() if source == "hand" else copy.deepcopy(request.getfixturevalue("zbv_plan"))
    validate_plan(parse_plan(copy.deepcopy(plan), "p.json"))  # the unbroken plan passes
    edit, message = FOUND_MISSING[case]
    edit(plan)
    with pytest.raises(RunError) as info:
        validate_plan(parse_plan(plan, "p.json"))
    assert message in str(info.value)
    assert str(info.value).startswith("hp_recompute: plan p.json: rank ")


def test_the_deadlock_check_matches_messages_by_tag_as_the_transfer_check_does() -> None:
    """Both match (kind, stage, mb, source, destination, tag): a plan the transfer check admits runs to its end."""
    from hp_recompute.plan.check import _check_deadlock

    plan = hand_plan()
    for a in plan["ranks"][0]["actions"] + plan["ranks"][1]["actions"]:
        if a["op"] in ("send_f", "recv_f") and a["microbatch"] == 0:
            a["tag"] = 40 if a["op"] == "send_f" else 41  # a message whose receive waits on another tag
    with pytest.raises(RunError, match="deadlock: every remaining rank waits"):
        _check_deadlock(parse_plan(plan, "p.json"))


def test_the_unbroken_plan_passes(zbv_plan: Plan) -> None:
    validate_plan(parse_plan(copy.deepcopy(zbv_plan), "p.json"))


@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_a_broken_plan_is_refused_naming_the_problem(zbv_plan: Plan, case: str) -> None:
    edit, message = CATALOGUE[case]
    plan = copy.deepcopy(zbv_plan)
    edit(plan)
    with pytest.raises(RunError) as info:
        validate_plan(parse_plan(plan, "p.json"))
    assert message in str(info.value)
    assert str(info.value).startswith("hp_recompute: plan p.json: ")


@pytest.mark.parametrize("case", ["receive without a send", "deadlock"])
def test_the_runner_refuses_before_any_rank_starts(tmp_path: Path, zbv_plan: Plan, case: str) -> None:
    edit, message = CATALOGUE[case]
    plan = copy.deepcopy(zbv_plan)
    edit(plan)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(plan))
    start = time.monotonic()
    proc = run_cli("--plan", str(path), "--timeout", "120")
    assert proc.returncode == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr
    # A receive without a send would otherwise wait out the 120 s timeout.
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("case", ["duplicate tag", "reduce_grad before the last W", "retain on the last consumer"])
def test_the_runner_refuses_a_rule_the_trial_found_missing(tmp_path: Path, zbv_plan: Plan, case: str) -> None:
    edit, message = FOUND_MISSING[case]
    plan = copy.deepcopy(zbv_plan)
    edit(plan)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(plan))
    proc = run_cli("--plan", str(path), "--timeout", "120")
    assert proc.returncode == 1
    assert f"hp_recompute: plan {path}: rank " in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr
