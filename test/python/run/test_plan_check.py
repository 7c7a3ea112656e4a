"""The runtimes' admission check (``hp_recompute.plan.check``) on a catalogue of hand-broken plans.

Each case edits a real plan (ZBV, 2 ranks, 4 microbatches, the bundled GPT's costs) the
way a hand edit or a bad tool would, and must be refused naming what is wrong; the
unbroken plan passes. The runner refuses before starting any rank (exit 1, in seconds).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from hp_recompute.plan import validate_plan
from hp_recompute.plan import RunError, parse_plan
from hpr_run_util import GPT_MODEL_JSON, make_plan, run_cli

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
