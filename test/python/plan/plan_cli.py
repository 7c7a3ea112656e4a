"""Helpers for tests that run the hp-recompute-plan binary and read its plans.

The checks here re-derive every invariant from the plan JSON alone, without
the C++ code's help, so they judge the planner rather than repeat it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
BUILD = Path(os.environ.get("HPR_BUILD_DIR", REPO / "build"))
PLAN_TOOL = BUILD / "bin" / "hp-recompute-plan"
SCHEMA = REPO / "docs" / "schemas" / "plan.schema.json"
SCHEDULES = REPO / "test" / "inputs" / "schedules"

COMPUTE_OPS = ("forward", "backward_input", "backward_weight", "backward")
CONSUMER_OPS = ("backward_input", "backward_weight", "backward")


def run_plan(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the planner; fails the test with its stderr when it fails."""
    assert PLAN_TOOL.exists(), f"build the project first: {PLAN_TOOL} is missing"
    proc = subprocess.run([str(PLAN_TOOL), *args], capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def plan_json(*args: str) -> dict[str, Any]:
    return json.loads(run_plan(*args, "--emit", "json").stdout)


def compute_order(plan: dict[str, Any]) -> list[list[tuple[str, int, int]]]:
    """Each rank's forward/backward actions in order, as (op, stage, mb)."""
    return [
        [(a["op"], a["stage"], a["microbatch"]) for a in rank["actions"] if a["op"] in COMPUTE_OPS]
        for rank in plan["ranks"]
    ]


_CELL_COMPUTE = re.compile(r"(\d+)(BW|F|I|W|B)(\d+)")


def csv_compute_order(path: Path, dialect: str = "current") -> list[list[tuple[str, int, int]]]:
    """The compute actions of a schedule CSV, read independently of the C++ parser."""
    names = {"F": "forward", "I": "backward_input", "W": "backward_weight", "B": "backward"}
    if dialect == "legacy":
        names.update({"B": "backward_input", "BW": "backward"})
    order = []
    for line in path.read_text().splitlines():
        rank = []
        for cell in line.split(","):
            cell = cell.strip()
            if "SEND" in cell or "RECV" in cell or "SHARD" in cell or "REDUCE" in cell:
                continue
            for stage, kind, mb in _CELL_COMPUTE.findall(cell):
                rank.append((names[kind], int(stage), int(mb)))
        order.append(rank)
    return order


def check_lifecycles(plan: dict[str, Any]) -> None:
    """Asserts DESIGN's session contract on every rank of `plan`."""
    sessions = {s["id"]: s for s in plan["sessions"]}
    stage_to_rank = plan["schedule"]["stage_to_rank"]
    seen: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rank in plan["ranks"]:
        for index, action in enumerate(rank["actions"]):
            sid = action.get("session")
            if sid is None:
                continue
            assert sid in sessions, f"rank {rank['rank']} action {index} names unknown {sid}"
            assert sessions[sid]["rank"] == rank["rank"], f"{sid} used on rank {rank['rank']}"
            assert stage_to_rank[sessions[sid]["stage"]] == rank["rank"]
            assert (action["stage"], action["microbatch"]) == (
                sessions[sid]["stage"],
                sessions[sid]["microbatch"],
            )
            kind = "consumer" if action["op"] in CONSUMER_OPS else action["op"]
            if action.get("for_weight"):  # the replay for the dw: its own rule below
                seen[sid]["for_weight"].append(index)
                continue
            if action.get("drops_replay"):
                seen[sid]["drops"].append(index)
            seen[sid][kind].append(index)
            if kind == "recompute":
                seen[sid]["pieces"].append((action.get("regions"), action.get("in_backward", False)))
            if kind == "consumer":
                seen[sid]["retain"].append(action["retain_on_unpack"])
    for sid in sessions:
        uses = seen[sid]
        # One recompute, or pieces: each region of the session in exactly one, the one inside
        # the backward (if any) last.
        pieces = uses["pieces"]
        if len(pieces) != 1 or pieces[0][0] is not None:
            regions = sorted(r for listed, _ in pieces for r in (listed if listed is not None else [-1]))
            assert regions == list(range(len(sessions[sid]["regions"]))), f"{sid}: pieces {pieces}"
            assert not any(inside for _, inside in pieces[:-1]), f"{sid}: pieces {pieces}"
        assert len(uses["clear"]) == 1, f"{sid}: {len(uses['clear'])} clears"
        assert uses["consumer"], f"{sid} has no consumer"
        assert max(uses["recompute"]) < min(uses["consumer"]), f"{sid}: read before recompute"
        assert uses["clear"][0] > max(uses["consumer"]), f"{sid}: read after clear"
        retain = uses["retain"]
        assert retain == [True] * (len(retain) - 1) + [False], f"{sid}: retain flags {retain}"
        # hpr.verify.weight-replay: at most one replay for the dw, between the dx (which drops the first replay,
        # and says so) and the dw.
        again = uses["for_weight"]
        assert len(again) <= 1, f"{sid}: {len(again)} replays for its dw"
        if again:
            assert len(uses["consumer"]) == 2 and uses["drops"] == uses["consumer"][:1], f"{sid}: {dict(uses)}"
            assert uses["consumer"][0] < again[0] < uses["consumer"][1], f"{sid}: replay for its dw misplaced"
        else:
            assert not uses["drops"], f"{sid}: drops its replay but has none for its dw"
