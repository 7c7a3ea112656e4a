"""Reading a plan on hostile plan files: a located error, never a traceback.

Each case damages the hand-written plan (hand_plan.py) the way the hostile trial of issue
24 did and expects a ``RunError`` that names the file, the JSON path (or line:column for
bytes that are not JSON) and what was expected. The planner's own reader says it
(``admit_plan``, through the extension: the words of ``hp-recompute-plan --verify``);
Python itself only reads the bytes. The runner's command line exits 1 with the same
message and no traceback. Runs on torch 1.13 and 2.13.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

from cli_processes import run_module
from hand_plan import hand_plan
from hp_recompute.plan import RunError, admit_plan, load_plan
from hp_recompute.plan.reader import build_plan

Plan = Dict[str, Any]


def _actions(p: Plan, rank: int = 0) -> list:
    return p["ranks"][rank]["actions"]


def _set(path: str, value: Any) -> Callable[[Plan], None]:
    """An edit setting the field at ``path`` (``ranks/0/actions/1/tag``) to ``value``; ``...`` deletes it."""
    def edit(p: Plan) -> None:
        *parents, last = path.split("/")
        node: Any = p
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        key = int(last) if isinstance(node, list) else last
        if value is ...:
            del node[key]
        else:
            node[key] = value
    return edit


def _duplicate_session(p: Plan) -> None:
    p["sessions"].append(dict(p["sessions"][0]))


def _second_session_of_one_microbatch(p: Plan) -> None:
    p["sessions"].append(dict(p["sessions"][0], id="again"))


# case -> (edit, JSON path in the message, what the message expects)
CASES = {
    "boolean stage_to_rank entry": (_set("schedule/stage_to_rank/1", True), "/schedule/stage_to_rank/1",
                                    "expected a rank in [0, 2), got 'true'"),
    "overlap as a string": (_set("ranks/0/actions/0/overlap", "false"), "/ranks/0/actions/0/overlap",
                            "expected true or false, got '\"false\"'"),
    "sessions is a number": (_set("sessions", 5), "/sessions", "expected an array, got '5'"),
    "a list as a session id": (_set("ranks/0/actions/5/session", ["s0.mb0"]), "/ranks/0/actions/5/session",
                               "expected a non-empty string"),
    "a duplicate session": (_duplicate_session, "/sessions/2/id", "a second session with id s0.mb0"),
    "two sessions of one microbatch": (_second_session_of_one_microbatch, "/sessions/2",
                                       "a second session of stage 0 mb 0 (the first is s0.mb0)"),
    "a transfer without a tag": (_set("ranks/0/actions/1/tag", ...), "/ranks/0/actions/1",
                                 "no message tag, but other transfers of this schedule have one"),
    "a boolean tag": (_set("ranks/0/actions/1/tag", True), "/ranks/0/actions/1/tag", "got 'true'"),
    "a reduce_grad without its stage": (_set("ranks/0/actions/13/stage", ...), "/ranks/0/actions/13",
                                        "missing required key 'stage'"),
    "a boolean retain_on_unpack": (_set("ranks/0/actions/6/retain_on_unpack", 1),
                                   "/ranks/0/actions/6/retain_on_unpack", "expected true or false, got '1'"),
    "version true": (_set("version", True), "/version", "got 'true'"),
    "posts as a string": (_set("ranks/1/actions/0/posts", "0"), "/ranks/1/actions/0/posts",
                          "expected an array of action indices, got '\"0\"'"),
    "posts past the rank's actions": (_set("ranks/1/actions/0/posts", [0, 9]), "/ranks/1/actions/0/posts/1",
                                      "expected an action index of rank 1 in [0, 9), got '9'"),
    "a boolean in posts": (_set("ranks/1/actions/0/posts", [True]), "/ranks/1/actions/0/posts/0", "got 'true'"),
    "posts on a send": (_set("ranks/0/actions/1/posts", [1]), "/ranks/0/actions/1/posts", "unknown key"),
    "waits as a number": (_set("ranks/1/actions/1/waits", 0), "/ranks/1/actions/1/waits",
                          "expected an array of action indices, got '0'"),
    "waits past the rank's actions": (_set("ranks/1/actions/1/waits", [9]), "/ranks/1/actions/1/waits/0",
                                      "expected an action index of rank 1 in [0, 9), got '9'"),
    "waits on a receive": (_set("ranks/1/actions/0/waits", [0]), "/ranks/1/actions/0/waits", "unknown key"),
    "a boolean hands_to": (_set("ranks/1/actions/1/hands_to", True), "/ranks/1/actions/1/hands_to", "got 'true'"),
    "hands_to past the stages": (_set("ranks/1/actions/1/hands_to", 2), "/ranks/1/actions/1/hands_to",
                                 "got '2'"),
    "hands_to on a W": (_set("ranks/0/actions/7/hands_to", 1), "/ranks/0/actions/7/hands_to", "unknown key"),
    "last_backward as a number": (_set("ranks/1/actions/6/last_backward", 1), "/ranks/1/actions/6/last_backward",
                                  "expected true or false, got '1'"),
    "last_backward on an I": (_set("ranks/0/actions/6/last_backward", True), "/ranks/0/actions/6/last_backward",
                              "unknown key"),
}


def test_posts_are_read_for_receives_only() -> None:
    plan = admit_plan(hand_plan(), "p.json")
    assert [a.posts for a in plan.ranks[1]] == [(0,), (), (), (), (4,), (), (), (), ()]
    assert [a.posts for a in plan.ranks[0] if a.op == "recv_b"] == [(4,), (9,)]
    # Posting both at the first receive is a plan's too (rank 1's first receive posts the second early).
    raw = hand_plan()
    raw["ranks"][1]["actions"][0]["posts"], raw["ranks"][1]["actions"][4]["posts"] = [0, 4], []
    plan = admit_plan(raw, "p.json")
    assert (plan.ranks[1][0].posts, plan.ranks[1][4].posts) == ((0, 4), ())


def test_the_lowered_members_are_read_onto_their_actions() -> None:
    plan = admit_plan(hand_plan(), "p.json")
    assert [a.waits for a in plan.ranks[1]] == [(), (0,), (), (), (), (4,), (), (), ()]
    assert [(a.op, a.microbatch) for a in plan.ranks[0] if a.waits] == [("backward_input", 0), ("backward", 1)]
    assert [(r, a.stage, a.microbatch) for r, actions in enumerate(plan.ranks) for a in actions
            if a.last_backward] == [(0, 0, 1), (1, 1, 1)]
    assert all(a.hands_to == -1 for actions in plan.ranks for a in actions)  # one stage per rank


def test_the_hand_plan_is_valid() -> None:
    plan = admit_plan(hand_plan(), "p.json")
    assert plan.tagged and [a.op for a in plan.ranks[1]][:3] == ["recv_f", "forward", "backward"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_field_is_refused_at_its_json_path(case: str) -> None:
    """The planner's own reader refuses it (``admit_plan``), in the words of hp-recompute-plan --verify."""
    edit, where, message = CASES[case]
    plan = hand_plan()
    edit(plan)
    with pytest.raises(RunError) as info:
        admit_plan(plan, "p.json")
    lines = str(info.value).splitlines()
    assert lines[0].startswith("hp_recompute: plan p.json is refused before any rank runs"), lines
    assert any(line.startswith(f"  p.json: {where}: ") and message in line for line in lines), lines


def test_an_op_the_runtime_does_not_execute_is_refused_not_skipped() -> None:
    """``build_plan``'s own check: a runtime that skipped an action would run a wrong step silently."""
    raw = hand_plan()
    raw["ranks"][0]["actions"][0]["op"] = "overlap_f_b"
    with pytest.raises(RunError, match=r"p.json: /ranks/0/actions/0/op: expected an op this runtime executes"):
        build_plan(raw, "p.json")


def _text(plan: Plan) -> bytes:
    return json.dumps(plan, indent=1).encode()


# case -> (file bytes, message): Python reads the bytes (UTF-8), the planner's reader the JSON
FILES = {
    "invalid UTF-8": (_text(hand_plan()).replace(b'"name": "hand"', b'"name": "h\xffnd"', 1),
                      ":5:13: invalid UTF-8 (byte 0xff); expected UTF-8 text"),
    "deeply nested JSON": (b'{"format": "hp-recompute-plan", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
                           ":1:101: invalid JSON: nested deeper than 64 levels"),
    "a 5000-digit integer": (_text(hand_plan()).replace(b'"num_microbatches": 2', b'"num_microbatches": ' +
                                                        b"7" * 5000),
                             ":8:23: invalid JSON: number overflow: '77777777777777777777...' (5000 characters)"),
    "a NaN session id": (_text(hand_plan()).replace(b'"id": "s0.mb0"', b'"id": NaN'),
                         ":49:10: invalid JSON: syntax error while parsing value - invalid literal"),
}


@pytest.mark.parametrize("case", sorted(FILES))
def test_a_bad_plan_file_is_refused_with_its_location(tmp_path: Path, case: str) -> None:
    data, message = FILES[case]
    path = tmp_path / "p.json"
    path.write_bytes(data)
    with pytest.raises(RunError) as info:
        load_plan(str(path))
    assert f"{path}{message}" in str(info.value)
    assert str(info.value).startswith("hp_recompute: ")


@pytest.mark.parametrize("case", ["invalid UTF-8", "deeply nested JSON", "a 5000-digit integer"])
def test_the_runner_exits_1_with_the_location(tmp_path: Path, case: str) -> None:
    data, message = FILES[case]
    path = tmp_path / "p.json"
    path.write_bytes(data)
    proc = run_module("hp_recompute.run", ["--plan", str(path)], timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"{path}{message}" in proc.stderr
    assert "Traceback" not in proc.stderr
