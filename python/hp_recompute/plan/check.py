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
   name a session of another (stage, microbatch). ``retain_on_unpack`` is true on every
   consumer of a session but the last, and false on the last (which lets the replayed
   tensors go as it reads them; true there keeps them until the clear, false earlier
   frees what a later consumer still reads).
3. Transfers: ``send_f`` of stage s goes to the rank of s + 1 and ``send_b`` to the rank
   of s - 1, never to the sender itself; each has exactly one matching receive there,
   and each receive one matching send, with the same message tag. Neighbours on one
   rank exchange nothing.
3a. Tags name messages. The multi-process runner posts ``isend(dst, tag)`` and
   ``irecv(src, tag)`` (runner/multiprocess.py): a receive takes the first message from
   its source with its tag, whatever the kind, stage or microbatch. So in a tagged plan
   every transfer has a tag, and the tags of a rank's sends to one peer, and of its
   receives from one peer, are all different. A plan read from a torch CSV has no tags
   at all (torch's ops carry none; PlannedSchedule matches messages by posting order,
   Rule 3a of pipelining/schedule.py).
4. No deadlock: running every rank's program with blocking receives and buffered sends
   reaches the end on every rank. A receive waits for the message of Rule 3 (the same
   key, tag included, as the transfer check).
5. Data flow: a ``send_f`` of (stage, mb) comes after that forward, a ``send_b`` after
   its ``backward_input`` or ``backward`` (what it sends exists only then); a ``recv_f``
   comes before that forward and a ``recv_b`` before its ``backward_input`` or
   ``backward`` (the action that reads what it receives).
6. Gradient reduction runs exactly once per stage, after the stage's last
   ``backward_weight`` and ``backward``: a ``reduce_grad`` there, or none, and the runtime
   runs it at that point (Rule 5 of pipelining/schedule.py). A ``reduce_grad`` before the
   last W scales or reduces gradients that later Ws still add to; a second one scales
   them again: both train with wrong gradients, silently.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Set, Tuple

from .reader import CONSUMER_OPS, TRANSFER_OPS, Action, Plan, RunError

__all__ = ["validate_plan"]

Key = Tuple[int, int]


Message = Tuple[str, int, int, int, int, int]  # kind, sending stage, microbatch, source, destination, tag
PRODUCERS = {"send_f": ("forward",), "send_b": ("backward_input", "backward")}
CONSUMERS = {"recv_f": ("forward",), "recv_b": ("backward_input", "backward")}


def _refuse(plan: Plan, rank: int, index: int, what: str) -> RunError:
    return RunError(f"hp_recompute: plan {plan.path}: {plan.where(rank, index)}: {what}")


def _message(rank: int, a: Action) -> Message:
    """The message a transfer of ``rank`` sends or receives (Rules 3 and 4 match on it)."""
    step = 1 if a.op[-1] == "f" else -1
    if a.op.startswith("send"):
        return a.op[-1], a.stage, a.microbatch, rank, a.peer, a.tag
    return a.op[-1], a.stage - step, a.microbatch, a.peer, rank, a.tag


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
                    raise _refuse(plan, rank, index, f"a second {a.op} of stage {a.stage} mb {a.microbatch} "
                                                     f"(the first is action {ops[a.op]})")
                if a.op != "forward" and "forward" not in ops:
                    raise _refuse(plan, rank, index, "runs before the forward of its stage and microbatch")
                if a.op == "backward_weight" and "backward_input" not in ops:
                    raise _refuse(plan, rank, index, "backward_weight before its backward_input")
                if a.op in ("backward_input", "backward_weight") and "backward" in ops or \
                        a.op == "backward" and ("backward_input" in ops or "backward_weight" in ops):
                    raise _refuse(plan, rank, index, "mixes a full backward with a dx/dw split")
                want = session_of.get(key)
                if a.session is not None and a.session != want:
                    raise _refuse(plan, rank, index, f"names session {a.session}, which belongs to "
                                                     f"another stage or microbatch")
                if a.op in ("backward_input", "backward_weight", "backward"):
                    if want is not None and a.session is None:
                        raise _refuse(plan, rank, index, f"does not name session {want} of its stage and "
                                                         f"microbatch")
                    if want is not None and "recompute" not in ops:
                        raise _refuse(plan, rank, index, f"consumes session {want} before its recompute")
                    if "clear" in ops:
                        raise _refuse(plan, rank, index, f"consumes session {want} after its clear")
                if a.op == "clear" and not any(o in ops for o in ("backward_weight", "backward")):
                    raise _refuse(plan, rank, index, "clears the session before its last backward")
                if a.op in ("backward_input", "backward_weight", "backward"):
                    last_ops = ("backward_weight", "backward")
                    if a.frees_graph != (a.op in last_ops):
                        raise _refuse(plan, rank, index, "frees_graph must mark the last backward of a stage "
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


def _check_retain(plan: Plan) -> None:
    """Rule 2, ``retain_on_unpack``: true on every consumer of a session but the last."""
    consumers: Dict[str, List[Tuple[int, int]]] = defaultdict(list)
    for rank, actions in enumerate(plan.ranks):
        for index, a in enumerate(actions):
            if a.op in CONSUMER_OPS and a.session is not None:
                consumers[a.session].append((rank, index))
    for sid, uses in consumers.items():
        last_index = uses[-1][1]
        for rank, index in uses:
            a, last = plan.ranks[rank][index], (rank, index) == uses[-1]
            if a.retain_on_unpack and last:
                raise _refuse(plan, rank, index, f"retain_on_unpack is true on the last consumer of session {sid}; "
                                                 f"it must be false there, so the replayed tensors go as it reads "
                                                 f"them")
            if not a.retain_on_unpack and not last:
                raise _refuse(plan, rank, index, f"retain_on_unpack is false on a consumer of session {sid} before "
                                                 f"its last (action {last_index}); it must be true, or the replayed "
                                                 f"tensors are freed before the last consumer reads them")


def _check_transfers(plan: Plan) -> None:
    """Rules 3 and 3a."""
    sends: Dict[Message, Tuple[int, int]] = {}
    recvs: Dict[Message, Tuple[int, int]] = {}
    tags: Dict[Tuple[bool, int, int, int], int] = {}  # (is a send, rank, peer, tag) -> action index
    first: Dict[Tuple[object, ...], int] = {}  # (is a send, message without its tag) -> action index
    s2r = plan.stage_to_rank
    for rank, actions in enumerate(plan.ranks):
        for index, a in enumerate(actions):
            if a.op not in TRANSFER_OPS:
                continue
            is_send, key = a.op.startswith("send"), _message(rank, a)
            other = key[1] + (1 if key[0] == "f" else -1) if is_send else key[1]
            if not 0 <= other < plan.num_stages:
                raise _refuse(plan, rank, index, f"stage {other} does not exist")
            if a.peer == rank:
                raise _refuse(plan, rank, index, "a transfer to or from its own rank")
            if a.peer != s2r[other]:
                raise _refuse(plan, rank, index, f"stage {other} runs on rank {s2r[other]}, not {a.peer}")
            channel = (is_send, rank, a.peer, a.tag)
            if plan.tagged and channel in tags:
                other_op = "send to" if is_send else "receive from"
                raise _refuse(plan, rank, index, f"tag {a.tag} is already used by action {tags[channel]}, another "
                                                 f"{other_op} rank {a.peer}; a receive takes the first message "
                                                 f"with its tag from its source, so tags must be unique per peer "
                                                 f"and direction")
            tags[channel] = index
            once = (is_send,) + key[:5]  # the message, whatever its tag: sent and received once
            if once in first:
                raise _refuse(plan, rank, index, f"a second {a.op} (the first is action {first[once]})")
            first[once] = index
            (sends if is_send else recvs)[key] = (rank, index)
    for key, (rank, index) in sends.items():
        if key not in recvs:
            raise _refuse(plan, rank, index, f"no rank {key[4]} receives it (with tag {key[5]})")
    for key, (rank, index) in recvs.items():
        if key not in sends:
            raise _refuse(plan, rank, index, f"rank {key[3]} never sends it (with tag {key[5]})")


def _check_data_flow(plan: Plan) -> None:
    """Rule 5: a send after the action that produces its tensor, a receive before the one that reads it."""
    for rank, actions in enumerate(plan.ranks):
        at: Dict[Tuple[str, int, int], int] = {}  # (op, stage, mb) -> index of that compute action
        for index, a in enumerate(actions):
            if a.op in ("forward",) + CONSUMER_OPS:
                at.setdefault((a.op, a.stage, a.microbatch), index)
        for index, a in enumerate(actions):
            if a.op not in TRANSFER_OPS:
                continue
            is_send = a.op.startswith("send")
            ops = PRODUCERS[a.op] if is_send else CONSUMERS[a.op]
            found = [(at[(op, a.stage, a.microbatch)], op) for op in ops if (op, a.stage, a.microbatch) in at]
            if not found:
                continue  # Rule 1 refuses the missing forward or backward
            other, op = min(found)
            if is_send and other > index:
                raise _refuse(plan, rank, index, f"sends before action {other} ({op} stage {a.stage} mb "
                                                 f"{a.microbatch}) produces what it sends; a send must come after "
                                                 f"its producer")
            if not is_send and other < index:
                raise _refuse(plan, rank, index, f"receives after action {other} ({op} stage {a.stage} mb "
                                                 f"{a.microbatch}) reads what it receives; a receive must come "
                                                 f"before its consumer")


def _check_reduce(plan: Plan) -> None:
    """Rule 6: at most one reduce_grad per stage, after the stage's last W and B."""
    for rank, actions in enumerate(plan.ranks):
        last: Dict[int, int] = {}
        for index, a in enumerate(actions):
            if a.op in ("backward_weight", "backward"):
                last[a.stage] = index
        first: Dict[int, int] = {}
        for index, a in enumerate(actions):
            if a.op != "reduce_grad":
                continue
            if a.stage in first:
                raise _refuse(plan, rank, index, f"a second reduce_grad of stage {a.stage} (the first is action "
                                                 f"{first[a.stage]}); gradients are reduced once per stage, after "
                                                 f"its last backward_weight or backward, or they are scaled twice")
            if index < last.get(a.stage, -1):
                later = actions[last[a.stage]]
                raise _refuse(plan, rank, index, f"runs before action {last[a.stage]} ({later.describe()}), the "
                                                 f"last backward of stage {a.stage}; gradients are reduced once "
                                                 f"per stage, after its last backward_weight or backward")
            first[a.stage] = index


def _check_deadlock(plan: Plan) -> None:
    """Rule 4: a round-robin run of all programs; a receive waits for its send (the same message as Rule 3)."""
    pc = [0] * plan.num_ranks
    sent: Set[Message] = set()
    progressed = True
    while progressed:
        progressed = False
        for rank, actions in enumerate(plan.ranks):
            while pc[rank] < len(actions):
                a = actions[pc[rank]]
                if a.op in ("recv_f", "recv_b"):
                    if _message(rank, a) not in sent:
                        break
                elif a.op in ("send_f", "send_b"):
                    sent.add(_message(rank, a))
                pc[rank] += 1
                progressed = True
    waiting = [r for r in range(plan.num_ranks) if pc[r] < len(plan.ranks[r])]
    if waiting:
        parts = [plan.where(r, pc[r]) for r in waiting]
        raise RunError(f"hp_recompute: plan {plan.path}: deadlock: every remaining rank waits in a receive whose "
                       f"send comes later: " + "; ".join(parts))


def validate_plan(plan: Plan) -> None:
    """Refuses a plan that breaks the contract (module docstring), naming the first bad action."""
    _check_compute(plan)
    _check_retain(plan)
    _check_transfers(plan)
    _check_data_flow(plan)
    _check_reduce(plan)
    _check_deadlock(plan)
