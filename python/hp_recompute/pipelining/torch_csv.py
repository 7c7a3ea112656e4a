"""Reading ``hp-recompute-plan --emit torch-csv`` output back as a plan.

The CSV is torch's compute+comms schedule (``_PipelineScheduleRuntime._load_csv(...,
format="compute_comms")`` loads it; its cells are parsed here with torch's own
``_Action.from_str``). Torch's action set has no recompute and no clear, so the sidecar
``FILE.hpr.json`` carries them (docs/plan-format.md, "torch CSV"): per rank, each
recompute or clear with the index of the cell it runs before, the session and
``retain_on_unpack`` of each backward and whether it frees the graph, and the forwards
that run without checkpointing. The two together are turned into plan JSON and admitted
by the planner's own reader and verifier (``plan.verify.admit_plan``), as a plan file
is; each action keeps where it came from (a CSV cell as ``FILE:ROW:COL``, or a sidecar
entry by JSON path), so an error names the cell or the entry, never the JSON path of a
plan the user has not seen. The plan is untagged:
torch's point-to-point ops carry no tag, so messages match in posting order, and each
``RECV`` cell posts its receive where it stands (the plan's ``posts`` lists the receive itself).
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from torch.distributed.pipelining.schedules import _Action

from ..plan.reader import TRANSFER_OPS, Plan, RunError, expected, int_field, read_json, read_text
from ..plan.verify import admit_plan, planner_extension

__all__ = ["load_torch_csv", "sidecar_path"]

_OPS = {"F": "forward", "I": "backward_input", "W": "backward_weight", "B": "backward", "SEND_F": "send_f",
        "RECV_F": "recv_f", "SEND_B": "send_b", "RECV_B": "recv_b", "UNSHARD": "unshard", "RESHARD": "reshard",
        "REDUCE_GRAD": "reduce_grad"}
# What a consumer entry of the sidecar adds to its backward's cell.
_BOUND_FIELDS = ("session", "retain_on_unpack", "frees_graph")
_ACTION_PATH = re.compile(r"/ranks/(\d+)/actions/(\d+)(?:/(\w+))?")


def sidecar_path(csv_path: str) -> str:
    """``plan.csv`` -> ``plan.hpr.json``."""
    root, _ = os.path.splitext(csv_path)
    return root + ".hpr.json"


@dataclass
class _Source:
    """Where one action of the built plan came from: a CSV cell, or a sidecar insert."""

    location: str  # "plan.csv:2:5 ('3F0')" or "plan.hpr.json: /ranks/1/inserts/0"
    insert: Optional[str] = None  # the insert's JSON path in the sidecar
    fields: Dict[str, str] = field(default_factory=dict)  # field -> the sidecar JSON path it came from


class _Sources:
    """Maps the built plan's JSON paths and actions back to the user's two files."""

    def __init__(self, side_path: str) -> None:
        self.side_path = side_path
        self.ranks: List[List[_Source]] = []

    def locate(self, json_path: str) -> str:
        match = _ACTION_PATH.fullmatch(json_path)
        if match is None:  # /schedule, /model, /sessions: the sidecar's own
            return f"{self.side_path}: {json_path}"
        src, key = self.ranks[int(match[1])][int(match[2])], match[3] or ""
        if key in src.fields:
            return f"{self.side_path}: {src.fields[key]}"
        if src.insert is not None:
            return f"{self.side_path}: {src.insert}/{key}" if key else f"{self.side_path}: {src.insert}"
        return f"{src.location}: {key}" if key else src.location


def _read_sidecar(path: str, csv_path: str) -> Dict[str, Any]:
    side = read_json(path, "torch CSV sidecar")
    if not isinstance(side, dict) or side.get("format") != "hp-recompute-torch-csv" or side.get("version") != 1 \
            or isinstance(side.get("version"), bool):
        raise RunError(f"hp_recompute: {path}: expected a sidecar of format 'hp-recompute-torch-csv' version 1")
    name = os.path.basename(csv_path)
    if side.get("csv") != name:
        raise expected(f"{path}: /csv", f"'{name}', the CSV it sits beside (a sidecar written for another CSV "
                                        f"does not describe this one; write both again with --emit torch-csv)",
                       side.get("csv"))
    return side


def _read_rows(path: str) -> List[List[str]]:
    reader = csv.reader(io.StringIO(read_text(path, "torch CSV"), newline=""))
    try:
        return list(reader)
    except csv.Error as e:
        raise RunError(f"hp_recompute: {path}:{reader.line_num}: {e}") from None


def _cell_actions(path: str, row: int, col: int, cell: str, s2r: List[int]) -> List[Dict[str, Any]]:
    """The plan actions of one CSV cell (an OVERLAP_F_B cell holds two)."""
    try:
        action = _Action.from_str(cell)
    except RuntimeError as e:
        raise RunError(f"hp_recompute: {path}:{row + 1}:{col + 1}: {e}") from None
    if action is None:
        raise RunError(f"hp_recompute: {path}:{row + 1}:{col + 1}: empty cell; a compute+comms row has none")
    subs, overlap = (action.sub_actions, True) if action.sub_actions else ((action,), False)
    out = []
    for sub in subs:
        op = _OPS[sub.computation_type.value] if sub.computation_type.value in _OPS else None
        if op is None:
            raise RunError(f"hp_recompute: {path}:{row + 1}:{col + 1}: action '{cell}' is not one a plan has")
        entry: Dict[str, Any] = {"op": op, "stage": sub.stage_index}
        if sub.microbatch_index is not None:
            entry["microbatch"] = sub.microbatch_index
        if op in TRANSFER_OPS:  # torch's cell names no peer: the rank of the stage it talks to
            neighbour = planner_extension().neighbour_stage(op, sub.stage_index)
            if not 0 <= sub.stage_index < len(s2r) or not 0 <= neighbour < len(s2r):
                raise RunError(f"hp_recompute: {path}:{row + 1}:{col + 1}: '{cell}' has no neighbour stage")
            entry["peer"] = s2r[neighbour]
        if overlap:
            entry["overlap"] = True
        out.append(entry)
    return out


def _list(side_path: str, entry: Dict[str, Any], key: str, where: str) -> List[Dict[str, Any]]:
    """``entry[key]``: an optional list of objects."""
    items = entry.get(key, [])
    if not isinstance(items, list):
        raise expected(f"{side_path}: {where}/{key}", "a list", items)
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise expected(f"{side_path}: {where}/{key}/{k}", "an object", item)
    return items


@dataclass
class _RankSide:
    """One ``/ranks/R`` entry of the sidecar, checked (its ``cells`` is the row's length)."""

    inserts: Dict[int, List[Tuple[int, Dict[str, Any]]]]  # cell index -> (insert index, action)
    consumers: Dict[Tuple[str, int, int], Tuple[int, Dict[str, Any]]]  # (op, stage, mb) -> (index, entry)
    plain: Dict[Tuple[int, int], int]  # (stage, mb) -> index in /ranks/R/plain_forwards


def _rank_entry(path: str, side_path: str, r: int, entry: Any, row: List[str]) -> _RankSide:
    """Checks ``/ranks/R`` of the sidecar against row ``r`` of the CSV ``path``."""
    where = f"/ranks/{r}"
    at = lambda p: f"{side_path}: {p}"  # noqa: E731
    if not isinstance(entry, dict):
        raise expected(at(where), "an object with cells, and inserts, consumers and plain_forwards as "
                                  "--emit torch-csv writes them", entry)
    cells = int_field(at, entry, "cells", where, 0)
    if cells != len(row):
        raise RunError(f"hp_recompute: {path}:{r + 1}: {len(row)} cells, but the sidecar {side_path} was written "
                       f"for {cells}; write both again with --emit torch-csv")
    inserts: Dict[int, List[Tuple[int, Dict[str, Any]]]] = {}
    for k, item in enumerate(_list(side_path, entry, "inserts", where)):
        before = int_field(at, item, "before", f"{where}/inserts/{k}", 0, cells + 1)
        inserts.setdefault(before, []).append((k, {key: v for key, v in item.items() if key != "before"}))
    consumers: Dict[Tuple[str, int, int], Tuple[int, Dict[str, Any]]] = {}
    for k, c in enumerate(_list(side_path, entry, "consumers", where)):
        if c.get("op") not in ("backward_input", "backward_weight", "backward"):
            raise expected(at(f"{where}/consumers/{k}/op"), "backward_input, backward_weight or backward",
                           c.get("op"))
        key = (c["op"], int_field(at, c, "stage", f"{where}/consumers/{k}"),
               int_field(at, c, "microbatch", f"{where}/consumers/{k}"))
        if key in consumers:
            raise expected(at(f"{where}/consumers/{k}"), f"one entry per backward ({where}/consumers/"
                                                         f"{consumers[key][0]} is this one's)", c)
        consumers[key] = (k, c)
    plain: Dict[Tuple[int, int], int] = {}
    for k, p in enumerate(_list(side_path, entry, "plain_forwards", where)):
        plain[(int_field(at, p, "stage", f"{where}/plain_forwards/{k}"),
               int_field(at, p, "microbatch", f"{where}/plain_forwards/{k}"))] = k
    return _RankSide(inserts, consumers, plain)


def _rank_actions(path: str, side_path: str, r: int, row: List[str], side: _RankSide, s2r: List[int],
                  sources: List[_Source]) -> List[Dict[str, Any]]:
    """Row ``r`` of the CSV with its sidecar entry merged in, as plan actions; ``sources`` gets where each came from."""
    where = f"/ranks/{r}"
    actions: List[Dict[str, Any]] = []
    consumers, plain = dict(side.consumers), dict(side.plain)
    for col in range(len(row) + 1):
        for k, item in side.inserts.get(col, []):
            actions.append(item)
            sources.append(_Source(f"{side_path}: {where}/inserts/{k}", insert=f"{where}/inserts/{k}"))
        if col == len(row):
            break
        for a in _cell_actions(path, r, col, row[col], s2r):
            source = _Source(f"{path}:{r + 1}:{col + 1} ('{row[col]}')")
            bound = consumers.pop((a["op"], a["stage"], a.get("microbatch", -1)), None)
            if bound is not None:
                k, entry = bound
                for key in _BOUND_FIELDS:
                    if key in entry:
                        a[key] = entry[key]
                        source.fields[key] = f"{where}/consumers/{k}/{key}"
            if a["op"] in ("recv_f", "recv_b"):
                a["posts"] = [len(actions)]  # torch's RECV cell posts its receive where it stands
            if a["op"] == "forward" and (a["stage"], a.get("microbatch")) in plain:
                a["checkpoint"] = False
                source.fields["checkpoint"] = f"{where}/plain_forwards/{plain.pop((a['stage'], a['microbatch']))}"
            actions.append(a)
            sources.append(source)
    unused = [f"consumers/{min(k for k, _ in consumers.values())}"] if consumers else []
    unused += [f"plain_forwards/{min(plain.values())}"] if plain else []
    if unused:
        raise RunError(f"hp_recompute: {side_path}: {where}/{unused[0]}: names no action of row {r + 1} of {path}; "
                       f"write both again with --emit torch-csv")
    return actions


def load_torch_csv(path: str) -> Plan:
    """Reads ``path`` and its sidecar as a plan (``plan.Plan``)."""
    side_path = sidecar_path(path)
    side = _read_sidecar(side_path, path)
    rows = _read_rows(path)
    sched, ranks_side = side.get("schedule", {}), side.get("ranks")
    s2r = sched.get("stage_to_rank") if isinstance(sched, dict) else None
    if not isinstance(s2r, list) or not isinstance(ranks_side, list) or len(ranks_side) != len(rows):
        raise RunError(f"hp_recompute: {side_path}: expected /schedule/stage_to_rank and one /ranks entry per row "
                       f"of {path} ({len(rows)} rows)")
    sources = _Sources(side_path)
    ranks = []
    for r, (row, rank_side) in enumerate(zip(rows, ranks_side)):
        sources.ranks.append([])
        side_r = _rank_entry(path, side_path, r, rank_side, row)
        actions = _rank_actions(path, side_path, r, row, side_r, s2r, sources.ranks[r])
        ranks.append({"rank": r, "actions": actions})
    raw = {"format": "hp-recompute-plan", "version": 2, "schedule": sched, "model": side.get("model"),
           "sessions": side.get("sessions", []), "ranks": ranks}
    return admit_plan(raw, path, sources.locate)
