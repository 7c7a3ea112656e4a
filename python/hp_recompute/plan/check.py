"""Admission check of a plan before any rank runs it: the contract every runtime relies on.

Why here and not only in the planner: a runtime executes whatever file it is given --
edited by hand, produced by another tool, or corrupted -- and a broken plan must be
refused in seconds on every rank, naming the action, instead of hanging in a receive
or crashing in a send to its own rank. This module checks the *program* a plan
describes; it decides nothing (the planner's ``hpr-verify`` proves the same contract
on the IR; nothing here is imported by the planner or shared with it).

The contract (docs/runner.md, "What a runtime refuses"):

1. Every (stage, microbatch) has exactly one forward, and either one ``backward`` or
   one ``backward_input`` followed by one ``backward_weight``, on the stage's rank,
   after the forward. No microbatch of any stage is missing. Its last backward, and
   no other, frees the autograd graph (``frees_graph``).
2. A stage that checkpoints regions has a session for each microbatch whose forward is
   not plain; the session lives on that rank; its ``recompute`` runs once, after the
   forward and before the first backward; every backward of that (stage, microbatch)
   names the session; its ``clear`` runs once, after the last backward. Actions never
   name a session of another (stage, microbatch).
3. Transfers: ``send_f`` of stage s goes to the rank of s + 1 and ``send_b`` to the rank
   of s - 1, never to the sender itself; each has exactly one matching receive there,
   and each receive one matching send, with the same message tag. Neighbours on one
   rank exchange nothing.
4. No deadlock: running every rank's program with blocking receives and buffered sends
   reaches the end on every rank.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from .reader import Action, Plan, RunError

__all__ = ["validate_plan"]

Key = Tuple[int, int]


def _refuse(plan: Plan, rank: int, index: int, action: Action, what: str) -> RunError:
    return RunError(f"hp_recompute: plan {plan.path}: rank {rank} action {index} ({action.describe()}): {what}")


def _checkpointed(plan: Plan, stage: int) -> bool:
    return any(r.get("checkpoint", False) for r in plan.stages[stage])


def _check_compute(plan: Plan) -> None:
    """Rules 1 and 2."""
    session_of: Dict[Key, str] = {(s["stage"], s["microbatch"]): sid for sid, s in plan.sessions.items()}
    for sid, sess in plan.sessions.items():
        owner = plan.stage_to_rank[sess["stage"]]
        if sess.get("rank", owner) != owner:
            raise RunError(f"hp_recompute: plan {plan.path}: session {sid} is on rank {sess.get('rank')}, but stage "
                           f"{sess['stage']} runs on rank {owner}")
    for rank, actions in enumerate(plan.ranks):
        seen: Dict[Key, Dict[str, int]] = defaultdict(dict)  # (stage, mb) -> op -> index
        plain: Dict[Key, bool] = {}
        for index, a in enumerate(actions):
            if a.op in ("forward", "backward_input", "backward_weight", "backward", "recompute", "clear"):
                key, ops = (a.stage, a.microbatch), seen[(a.stage, a.microbatch)]
                if a.op in ops:
                    raise _refuse(plan, rank, index, a, f"a second {a.op} of stage {a.stage} mb {a.microbatch} "
                                                        f"(the first is action {ops[a.op]})")
                if a.op != "forward" and "forward" not in ops:
                    raise _refuse(plan, rank, index, a, "runs before the forward of its stage and microbatch")
                if a.op == "backward_weight" and "backward_input" not in ops:
                    raise _refuse(plan, rank, index, a, "backward_weight before its backward_input")
                if a.op in ("backward_input", "backward_weight") and "backward" in ops or \
                        a.op == "backward" and ("backward_input" in ops or "backward_weight" in ops):
                    raise _refuse(plan, rank, index, a, "mixes a full backward with a dx/dw split")
                want = session_of.get(key)
                if a.session is not None and a.session != want:
                    raise _refuse(plan, rank, index, a, f"names session {a.session}, which belongs to "
                                                        f"another stage or microbatch")
                if a.op in ("backward_input", "backward_weight", "backward"):
                    if want is not None and a.session is None:
                        raise _refuse(plan, rank, index, a, f"does not name session {want} of its stage and "
                                                            f"microbatch")
                    if want is not None and "recompute" not in ops:
                        raise _refuse(plan, rank, index, a, f"consumes session {want} before its recompute")
                    if "clear" in ops:
                        raise _refuse(plan, rank, index, a, f"consumes session {want} after its clear")
                if a.op == "clear" and not any(o in ops for o in ("backward_weight", "backward")):
                    raise _refuse(plan, rank, index, a, "clears the session before its last backward")
                if a.op in ("backward_input", "backward_weight", "backward"):
                    last_ops = ("backward_weight", "backward")
                    if a.frees_graph != (a.op in last_ops):
                        raise _refuse(plan, rank, index, a, "frees_graph must mark the last backward of a stage "
                                                            "and microbatch, and only it")
                if a.op == "forward":
                    plain[key] = a.plain
                ops[a.op] = index
        for stage in [s for s, r in enumerate(plan.stage_to_rank) if r == rank]:
            for mb in range(plan.num_microbatches):
                key, ops = (stage, mb), seen.get((stage, mb), {})
                done = "backward" in ops or "backward_weight" in ops
                if "forward" not in ops or not done:
                    raise RunError(f"hp_recompute: plan {plan.path}: rank {rank} has no "
                                   f"{'forward' if 'forward' not in ops else 'complete backward'} of stage {stage} "
                                   f"mb {mb}; every microbatch of every stage must run")
                needs = _checkpointed(plan, stage) and not plain.get(key, False)
                if needs and key not in session_of:
                    raise RunError(f"hp_recompute: plan {plan.path}: stage {stage} mb {mb} checkpoints regions but "
                                   f"has no session")
                if key in session_of and ("recompute" not in ops or "clear" not in ops):
                    missing = "recompute" if "recompute" not in ops else "clear"
                    raise RunError(f"hp_recompute: plan {plan.path}: rank {rank} has no {missing} of session "
                                   f"{session_of[key]}")


def _check_transfers(plan: Plan) -> None:
    """Rule 3."""
    sends: Dict[Tuple[str, int, int, int, int, int], Tuple[int, int]] = {}
    recvs: Dict[Tuple[str, int, int, int, int, int], Tuple[int, int]] = {}
    s2r = plan.stage_to_rank
    for rank, actions in enumerate(plan.ranks):
        for index, a in enumerate(actions):
            if a.op not in ("send_f", "recv_f", "send_b", "recv_b"):
                continue
            kind, is_send = a.op[-1], a.op.startswith("send")
            step = 1 if kind == "f" else -1
            sender = a.stage if is_send else a.stage - step
            other = a.stage + step if is_send else sender
            if not 0 <= other < plan.num_stages:
                raise _refuse(plan, rank, index, a, f"stage {other} does not exist")
            if a.peer == rank:
                raise _refuse(plan, rank, index, a, "a transfer to or from its own rank")
            if a.peer != s2r[other]:
                raise _refuse(plan, rank, index, a, f"stage {other} runs on rank {s2r[other]}, not {a.peer}")
            src, dst = (rank, a.peer) if is_send else (a.peer, rank)
            key = (kind, sender, a.microbatch, src, dst, a.tag)
            table = sends if is_send else recvs
            if key in table:
                raise _refuse(plan, rank, index, a, f"a second {a.op} (the first is action {table[key][1]})")
            table[key] = (rank, index)
    for key, (rank, index) in sends.items():
        if key not in recvs:
            raise _refuse(plan, rank, index, plan.ranks[rank][index], f"no rank {key[4]} receives it (with tag "
                                                                      f"{key[5]})")
    for key, (rank, index) in recvs.items():
        if key not in sends:
            raise _refuse(plan, rank, index, plan.ranks[rank][index], f"rank {key[3]} never sends it (with tag "
                                                                      f"{key[5]})")


def _check_deadlock(plan: Plan) -> None:
    """Rule 4: a round-robin run of all programs; a receive waits for its send."""
    pc = [0] * plan.num_ranks
    sent: set = set()
    progressed = True
    while progressed:
        progressed = False
        for rank, actions in enumerate(plan.ranks):
            while pc[rank] < len(actions):
                a = actions[pc[rank]]
                if a.op in ("recv_f", "recv_b"):
                    step = 1 if a.op == "recv_f" else -1
                    if (a.op[-1], a.stage - step, a.microbatch, a.peer, rank) not in sent:
                        break
                elif a.op in ("send_f", "send_b"):
                    sent.add((a.op[-1], a.stage, a.microbatch, rank, a.peer))
                pc[rank] += 1
                progressed = True
    waiting = [r for r in range(plan.num_ranks) if pc[r] < len(plan.ranks[r])]
    if waiting:
        parts = []
        for r in waiting:
            a = plan.ranks[r][pc[r]]
            parts.append(f"rank {r} action {pc[r]} ({a.describe()})")
        raise RunError(f"hp_recompute: plan {plan.path}: deadlock: every remaining rank waits in a receive whose "
                       f"send comes later: " + "; ".join(parts))


def validate_plan(plan: Plan) -> None:
    """Refuses a plan that breaks the contract (module docstring), naming the first bad action."""
    _check_compute(plan)
    _check_transfers(plan)
    _check_deadlock(plan)
