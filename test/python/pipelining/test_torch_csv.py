"""Reading a torch CSV and its sidecar (``hp_recompute.pipelining.load_torch_csv``) on damaged pairs.

The pair is the hand-written plan of test/python/plan/hand_plan.py in torch's compute+comms
form (no planner needed). Errors name the CSV cell as ``FILE:ROW:COL`` or the sidecar entry
by its JSON path, never a path of the plan JSON built from them; the admission check names
the cell of the action it refuses. torch 2.13 only (torch 1.13 has no pipelining).
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

pytest.importorskip("torch.distributed.pipelining", reason="needs torch.distributed.pipelining")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan"))
from hand_plan import ROWS, hand_sidecar, write_torch_csv  # noqa: E402
from hp_recompute.pipelining import load_torch_csv  # noqa: E402
from hp_recompute.pipelining.torch_csv import sidecar_path  # noqa: E402
from hp_recompute.plan import RunError  # noqa: E402

Side = Dict[str, Any]
Pair = Tuple[List[List[str]], Side]


def _reduce_before_the_last_w(rows: List[List[str]], side: Side) -> None:
    """Rank 0's REDUCE_GRAD moves from the row's end to before 0W0; the inserts keep their places."""
    rows[0].remove("0REDUCE_GRAD")
    rows[0].insert(rows[0].index("0W0"), "0REDUCE_GRAD")
    for item in side["ranks"][0]["inserts"]:
        if item["before"] > rows[0].index("0REDUCE_GRAD"):
            item["before"] += 1


def _reduce_twice(rows: List[List[str]], side: Side) -> None:
    rows[0].append("0REDUCE_GRAD")
    side["ranks"][0]["cells"] += 1


def _send_before_its_forward(rows: List[List[str]], side: Side) -> None:
    rows[0][0], rows[0][1] = rows[0][1], rows[0][0]


# case -> (edit, what the admission check says, the cell it names)
REFUSED = {
    "REDUCE_GRAD before the last W": (_reduce_before_the_last_w, "the last W or B of stage 0; gradients are "
                                      "reduced once per stage, after its last W and B",
                                      "1:7 ('0REDUCE_GRAD')"),
    "REDUCE_GRAD twice": (_reduce_twice, "second REDUCE_GRAD of stage 0 (first at rank 0, action 13",
                          "1:11 ('0REDUCE_GRAD')"),
    "a send before its forward": (_send_before_its_forward, "send before the action that produces it",
                                  "1:1 ('0SEND_F0')"),
}


def _pair() -> Pair:
    return copy.deepcopy(ROWS), hand_sidecar()


def test_the_hand_pair_reads_and_passes(tmp_path: Path) -> None:
    csv_path, _ = write_torch_csv(tmp_path)
    plan = load_torch_csv(str(csv_path))  # admitted
    assert not plan.tagged


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_broken_csv_is_refused_naming_the_cell_and_the_rule(tmp_path: Path, case: str) -> None:
    edit, message, cell = REFUSED[case]
    rows, side = _pair()
    edit(rows, side)
    csv_path, _ = write_torch_csv(tmp_path, rows, side)
    with pytest.raises(RunError) as info:  # the cells are all well formed: the admission check refuses
        load_torch_csv(str(csv_path))
    text = str(info.value)
    assert text.startswith(f"hp_recompute: plan {csv_path} is refused before any rank runs"), text
    assert f"{csv_path}:{cell}" in text and message in text


def _set(path: str, value: Any) -> Callable[[Side], None]:
    def edit(side: Side) -> None:
        *parents, last = path.split("/")
        node: Any = side
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


# case -> (sidecar edit, the JSON path in the sidecar, what the message expects)
SIDECAR = {
    "a boolean before": (_set("ranks/0/inserts/0/before", True), "/ranks/0/inserts/0/before",
                         "expected an integer in [0, 10], got 'true'"),
    "a boolean consumer stage": (_set("ranks/0/consumers/0/stage", False), "/ranks/0/consumers/0/stage",
                                 "expected an integer in [0, 65535], got 'false'"),
    "a sidecar for another CSV": (_set("csv", "other.csv"), "/csv", "expected 'plan.csv', the CSV it sits beside"),
    "a consumer's retain_on_unpack": (_set("ranks/0/consumers/0/retain_on_unpack", "yes"),
                                      "/ranks/0/consumers/0/retain_on_unpack", "expected true or false, got '\"yes\"'"),
    "an insert's session": (_set("ranks/0/inserts/1/session", "s9"), "/ranks/0/inserts/1/session",
                            "expected an id listed in /sessions"),
    "sessions is a number": (_set("sessions", 5), "/sessions", "expected an array, got '5'"),
    "a consumer of no cell": (_set("ranks/1/consumers/1/microbatch", 1 + 7), "/ranks/1/consumers/1",
                              "names no action of row 2"),
}


@pytest.mark.parametrize("case", sorted(SIDECAR))
def test_a_bad_sidecar_entry_is_named_in_the_sidecar(tmp_path: Path, case: str) -> None:
    edit, where, message = SIDECAR[case]
    side = hand_sidecar()
    edit(side)
    csv_path, side_path = write_torch_csv(tmp_path, side=side)
    with pytest.raises(RunError) as info:
        load_torch_csv(str(csv_path))
    assert f"{side_path}: {where}: " in str(info.value) and message in str(info.value), str(info.value)


def test_a_bad_cell_field_is_named_by_row_and_column(tmp_path: Path) -> None:
    rows, _ = _pair()
    rows[1][5] = "0F1"  # a stage of rank 0 in rank 1's row
    csv_path, _ = write_torch_csv(tmp_path, rows)
    with pytest.raises(RunError) as info:
        load_torch_csv(str(csv_path))
    assert f"{csv_path}:2:6 ('0F1'): stage: stage 0 runs on rank 0 (/schedule/stage_to_rank), not on rank 1" \
        in str(info.value)
    assert "/ranks/" not in str(info.value)


@pytest.mark.parametrize("which", ["csv", "sidecar"])
def test_invalid_utf8_is_located(tmp_path: Path, which: str) -> None:
    csv_path, side_path = write_torch_csv(tmp_path)
    path = csv_path if which == "csv" else side_path
    data = path.read_bytes()
    at = data.index(b"1F0") if which == "csv" else data.index(b"hand")
    path.write_bytes(data[:at] + b"\xc3(" + data[at:])
    with pytest.raises(RunError) as info:
        load_torch_csv(str(csv_path))
    line, col = (2, 10) if which == "csv" else (1, at + 1)  # row 2 is "1RECV_F0,1F0,..."; the sidecar one line
    assert f"{path}:{line}:{col}: invalid UTF-8 (byte 0xc3)" in str(info.value), str(info.value)


def test_a_deeply_nested_sidecar_is_located(tmp_path: Path) -> None:
    csv_path, side_path = write_torch_csv(tmp_path)
    side_path.write_text('{"format": ' + "[" * 50000 + "]" * 50000 + "}")
    with pytest.raises(RunError, match=r"plan\.hpr\.json:1:75: invalid JSON: nested deeper than 64 levels"):
        load_torch_csv(str(csv_path))


def test_a_missing_sidecar_is_named(tmp_path: Path) -> None:
    csv_path, side_path = write_torch_csv(tmp_path)
    assert sidecar_path(csv_path) == str(side_path)
    side_path.unlink()
    with pytest.raises(RunError, match=re.escape(f"hp_recompute: {side_path}: cannot read torch CSV sidecar: ")):
        load_torch_csv(csv_path)


def test_a_cell_that_is_not_torchs_is_named_by_row_and_column(tmp_path: Path) -> None:
    rows, _ = _pair()
    rows[1][1] = "1X0"
    csv_path, _ = write_torch_csv(tmp_path, rows)
    with pytest.raises(RunError) as info:
        load_torch_csv(str(csv_path))
    assert str(info.value).startswith(f"hp_recompute: {csv_path}:2:2: invalid action '1X0': expected an action type"), \
        str(info.value)
