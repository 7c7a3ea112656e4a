"""A small valid plan written by hand (no planner needed), as plan JSON and as a torch CSV pair.

Two ranks, one stage each, two microbatches. Stage 0 checkpoints its region: microbatch 0
splits its backward into I and W (one session, two consumers), microbatch 1 runs a full B.
Tags follow docs/plan-format.md: (sending stage x microbatches + mb) x 2 + (0 forward, 1 backward);
each receive posts itself (``posts``) and is waited for by the action that reads it (``waits``), each
stage's last backward says so (``last_backward``) and reduces its gradients after it.
Tests edit copies of it the way a hand edit or a bad tool would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

Plan = Dict[str, Any]


def _t(op: str, stage: int, mb: int, peer: int, tag: int, posts: List[int] | None = None) -> Dict[str, Any]:
    """A transfer; a receive lists the receives it posts (here each posts itself)."""
    action = {"op": op, "stage": stage, "microbatch": mb, "peer": peer, "tag": tag}
    return action if posts is None else {**action, "posts": posts}


def _c(op: str, stage: int, mb: int, **kw: Any) -> Dict[str, Any]:
    return {"op": op, "stage": stage, "microbatch": mb, **kw}


def _region(name: str, checkpoint: bool) -> Dict[str, Any]:
    """A region with the costs plan JSON requires (docs/schemas/plan.schema.json)."""
    return {"name": name, "checkpoint": checkpoint, "fwd_flops": 1000, "fwd_time_us": 1.0, "saved_bytes": 64,
            "input_bytes": 16, "param_bytes": 32}


def hand_plan() -> Plan:
    """The plan JSON (version 2)."""
    rank0 = [_c("forward", 0, 0), _t("send_f", 0, 0, 1, 0), _c("forward", 0, 1), _t("send_f", 0, 1, 1, 2),
             _t("recv_b", 0, 0, 1, 5, [4]), _c("recompute", 0, 0, session="s0.mb0"),
             _c("backward_input", 0, 0, waits=[4], session="s0.mb0", retain_on_unpack=True),
             _c("backward_weight", 0, 0, session="s0.mb0", frees_graph=True), _c("clear", 0, 0, session="s0.mb0"),
             _t("recv_b", 0, 1, 1, 7, [9]), _c("recompute", 0, 1, session="s0.mb1"),
             _c("backward", 0, 1, waits=[9], session="s0.mb1", frees_graph=True, last_backward=True),
             _c("clear", 0, 1, session="s0.mb1"), {"op": "reduce_grad", "stage": 0}]
    rank1 = [_t("recv_f", 1, 0, 0, 0, [0]), _c("forward", 1, 0, waits=[0]), _c("backward", 1, 0, frees_graph=True),
             _t("send_b", 1, 0, 0, 5), _t("recv_f", 1, 1, 0, 2, [4]), _c("forward", 1, 1, waits=[4]),
             _c("backward", 1, 1, frees_graph=True, last_backward=True), _t("send_b", 1, 1, 0, 7),
             {"op": "reduce_grad", "stage": 1}]
    return {"format": "hp-recompute-plan", "version": 2,
            "schedule": {"name": "hand", "num_ranks": 2, "num_stages": 2, "num_microbatches": 2,
                         "stage_to_rank": [0, 1]},
            "model": {"name": "hand", "stages": [{"stage": 0, "regions": [_region("a", True)]},
                                                 {"stage": 1, "regions": [_region("b", False)]}]},
            "sessions": [{"id": "s0.mb0", "stage": 0, "microbatch": 0, "rank": 0, "regions": ["a"]},
                         {"id": "s0.mb1", "stage": 0, "microbatch": 1, "rank": 0, "regions": ["a"]}],
            "ranks": [{"rank": 0, "actions": rank0}, {"rank": 1, "actions": rank1}]}


#: The same program as torch's compute+comms CSV (as --emit torch-csv writes it).
ROWS = [["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0I0", "0W0", "0RECV_B1", "0B1", "0REDUCE_GRAD"],
        ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1", "1REDUCE_GRAD"]]


def hand_sidecar(csv_name: str = "plan.csv") -> Plan:
    """The sidecar of ``ROWS``: recomputes and clears by cell, the consumers' sessions."""
    plan = hand_plan()
    inserts = [{"before": 5, "op": "recompute", "stage": 0, "microbatch": 0, "session": "s0.mb0"},
               {"before": 7, "op": "clear", "stage": 0, "microbatch": 0, "session": "s0.mb0"},
               {"before": 8, "op": "recompute", "stage": 0, "microbatch": 1, "session": "s0.mb1"},
               {"before": 9, "op": "clear", "stage": 0, "microbatch": 1, "session": "s0.mb1"}]
    consumers0 = [_c("backward_input", 0, 0, session="s0.mb0", retain_on_unpack=True),
                  _c("backward_weight", 0, 0, session="s0.mb0", retain_on_unpack=False, frees_graph=True),
                  _c("backward", 0, 1, session="s0.mb1", retain_on_unpack=False, frees_graph=True)]
    consumers1 = [_c("backward", 1, 0, frees_graph=True), _c("backward", 1, 1, frees_graph=True)]
    return {"format": "hp-recompute-torch-csv", "version": 1, "csv": csv_name, "schedule": plan["schedule"],
            "model": plan["model"], "sessions": plan["sessions"],
            "ranks": [{"rank": 0, "cells": len(ROWS[0]), "inserts": inserts, "consumers": consumers0,
                       "plain_forwards": []},
                      {"rank": 1, "cells": len(ROWS[1]), "inserts": [], "consumers": consumers1,
                       "plain_forwards": []}]}


def write_torch_csv(folder: Path, rows: List[List[str]] = ROWS, side: Plan | None = None) -> Tuple[Path, Path]:
    """Writes ``folder/plan.csv`` and ``folder/plan.hpr.json``; returns both paths."""
    csv_path, side_path = folder / "plan.csv", folder / "plan.hpr.json"
    csv_path.write_text("".join(",".join(row) + "\n" for row in rows))
    side_path.write_text(json.dumps(hand_sidecar() if side is None else side))
    return csv_path, side_path
