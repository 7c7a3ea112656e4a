"""Reading ``hp-recompute-plan --emit torch-csv`` output back as a plan.

The CSV is torch's compute+comms schedule (``_PipelineScheduleRuntime._load_csv(...,
format="compute_comms")`` loads it; its cells are parsed here with torch's own
``_Action.from_str``). Torch's action set has no recompute and no clear, so the sidecar
``FILE.hpr.json`` carries them (docs/plan-format.md, "torch CSV"): per rank, each
recompute or clear with the index of the cell it runs before, the session and
``retain_on_unpack`` of each backward and whether it frees the graph, and the forwards that run without checkpointing.
The two together are turned into plan JSON and read by ``plan.reader.parse_plan``, so
both inputs are checked by the same code.
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Dict, List, Tuple

from torch.distributed.pipelining.schedules import _Action

from ..plan.reader import Plan, RunError, parse_plan

__all__ = ["load_torch_csv", "sidecar_path"]

_OPS = {"F": "forward", "I": "backward_input", "W": "backward_weight", "B": "backward", "SEND_F": "send_f",
        "RECV_F": "recv_f", "SEND_B": "send_b", "RECV_B": "recv_b", "UNSHARD": "unshard", "RESHARD": "reshard",
        "REDUCE_GRAD": "reduce_grad"}
# Which neighbour a transfer of stage s talks to.
_PEER_STEP = {"send_f": 1, "recv_f": -1, "send_b": -1, "recv_b": 1}


def sidecar_path(csv_path: str) -> str:
    """``plan.csv`` -> ``plan.hpr.json``."""
    root, _ = os.path.splitext(csv_path)
    return root + ".hpr.json"


def _read_sidecar(path: str) -> Dict[str, Any]:
    try:
        with open(path, "r", encoding="utf-8") as f:
            side = json.load(f)
    except OSError as e:
        raise RunError(f"hp_recompute: cannot read the torch CSV's sidecar '{path}': {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise RunError(f"hp_recompute: {path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    if not isinstance(side, dict) or side.get("format") != "hp-recompute-torch-csv" or side.get("version") != 1:
        raise RunError(f"hp_recompute: {path}: expected a sidecar of format 'hp-recompute-torch-csv' version 1")
    return side


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
        if op in _PEER_STEP:
            neighbour = sub.stage_index + _PEER_STEP[op]
            if not 0 <= sub.stage_index < len(s2r) or not 0 <= neighbour < len(s2r):
                raise RunError(f"hp_recompute: {path}:{row + 1}:{col + 1}: '{cell}' has no neighbour stage")
            entry["peer"] = s2r[neighbour]
        if overlap:
            entry["overlap"] = True
        out.append(entry)
    return out


def _rank_entry(side_path: str, r: int, entry: Any):
    """One ``/ranks/R`` entry of the sidecar: (cells, inserts by cell, bound consumers, plain forwards)."""
    try:
        inserts: Dict[int, List[Dict[str, Any]]] = {}
        for item in entry.get("inserts", []):
            inserts.setdefault(item["before"], []).append({k: v for k, v in item.items() if k != "before"})
        bound: Dict[Tuple[str, int, int], Dict[str, Any]] = {
            (c["op"], c["stage"], c["microbatch"]): c for c in entry.get("consumers", [])}
        plain = {(p["stage"], p["microbatch"]) for p in entry.get("plain_forwards", [])}
        return entry["cells"], inserts, bound, plain
    except (AttributeError, KeyError, TypeError) as e:
        raise RunError(f"hp_recompute: {side_path}: /ranks/{r}: expected cells, and inserts, consumers and "
                       f"plain_forwards as --emit torch-csv writes them ({type(e).__name__}: {e})") from None


def load_torch_csv(path: str) -> Plan:
    """Reads ``path`` and its sidecar as a plan (``plan.Plan``)."""
    side_path = sidecar_path(path)
    side = _read_sidecar(side_path)
    try:
        with open(path, "r", encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise RunError(f"hp_recompute: cannot read torch CSV '{path}': {e.strerror}") from None
    sched, ranks_side = side.get("schedule", {}), side.get("ranks")
    s2r = sched.get("stage_to_rank") if isinstance(sched, dict) else None
    if not isinstance(s2r, list) or not isinstance(ranks_side, list) or len(ranks_side) != len(rows):
        raise RunError(f"hp_recompute: {side_path}: expected /schedule/stage_to_rank and one /ranks entry per row "
                       f"of {path} ({len(rows)} rows)")
    ranks = []
    for r, (row, rank_side) in enumerate(zip(rows, ranks_side)):
        cells, inserts, bound, plain = _rank_entry(side_path, r, rank_side)
        if cells != len(row):
            raise RunError(f"hp_recompute: {path}:{r + 1}: {len(row)} cells, but the sidecar {side_path} was written "
                           f"for {cells}; write both again with --emit torch-csv")
        actions: List[Dict[str, Any]] = []
        for col, cell in enumerate(row):
            actions.extend(inserts.pop(col, []))
            for a in _cell_actions(path, r, col, cell, s2r):
                key = (a["op"], a["stage"], a.get("microbatch", -1))
                if key in bound:
                    a.update({k: v for k, v in bound[key].items() if k in ("session", "retain_on_unpack",
                                                                            "frees_graph")})
                if a["op"] == "forward" and (a["stage"], a.get("microbatch")) in plain:
                    a["checkpoint"] = False
                actions.append(a)
        actions.extend(inserts.pop(len(row), []))
        if inserts:
            raise RunError(f"hp_recompute: {side_path}: /ranks/{r}/inserts: positions {sorted(inserts, key=str)} "
                           f"are outside row {r + 1} of {path} ({len(row)} cells)")
        ranks.append({"rank": r, "actions": actions})
    raw = {"format": "hp-recompute-plan", "version": 2, "schedule": sched, "model": side.get("model"),
           "sessions": side.get("sessions", []), "ranks": ranks}
    return parse_plan(raw, path)
