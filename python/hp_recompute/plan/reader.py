"""Reading a plan JSON (docs/plan-format.md) for the runner, with located errors.

Why a separate module: the runner trusts nothing upstream (DESIGN: runtimes read the
plan and nothing else), so it checks the fields it relies on and reports the JSON path
of the first bad one, the way the C++ tools do (``p.json: /ranks/1/actions/4/peer: ...``).
The full schema lives in docs/schemas/plan.schema.json; this is the runner's subset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["RunError", "Action", "Plan", "load_plan", "parse_plan"]

COMPUTE_OPS = ("forward", "backward_input", "backward_weight", "backward")
CONSUMER_OPS = ("backward_input", "backward_weight", "backward")
TRANSFER_OPS = ("send_f", "recv_f", "send_b", "recv_b")
NOOP_OPS = ("unshard", "reshard", "reduce_grad", "idle")
ALL_OPS = COMPUTE_OPS + ("recompute", "clear") + TRANSFER_OPS + NOOP_OPS


class RunError(RuntimeError):
    """A runner error; the message starts with ``hp_recompute.run:`` and says what to fix."""


@dataclass(frozen=True)
class Action:
    """One planned action of a rank (only the fields the runner uses)."""

    op: str
    stage: int = -1
    microbatch: int = -1
    session: Optional[str] = None
    retain_on_unpack: bool = False
    peer: int = -1
    #: A transfer's message tag (the same at both ends).
    tag: int = -1
    #: The last backward of its (stage, microbatch): the autograd graph is freed here.
    frees_graph: bool = False
    overlap: bool = False
    #: A forward of a checkpointed stage that runs plainly (plan ``"checkpoint": false``).
    plain: bool = False

    def describe(self) -> str:
        """Short text such as ``backward_input stage 3 mb 0 session s3.mb0``."""
        text = self.op
        if self.stage >= 0:
            text += f" stage {self.stage}"
        if self.microbatch >= 0:
            text += f" mb {self.microbatch}"
        if self.session is not None:
            text += f" session {self.session}"
        if self.peer >= 0:
            text += f" peer {self.peer}"
        return text


@dataclass
class Plan:
    """The parts of a plan the runner executes and checks."""

    path: str
    raw: Dict[str, Any]
    name: str
    num_ranks: int
    num_stages: int
    num_microbatches: int
    stage_to_rank: List[int]
    stages: List[List[Dict[str, Any]]]  # per stage: its region dicts
    sessions: Dict[str, Dict[str, Any]]
    ranks: List[List[Action]]
    summary: Dict[str, Any] = field(default_factory=dict)

    def weight_grad_order(self) -> Dict[int, List[int]]:
        """stage -> microbatches in the order their weight gradients are produced.

        The runner accumulates ``.grad`` in execution order; the reference step sums its
        per-microbatch gradients in this same order, so a bit-exact comparison is fair
        (floating-point addition is not associative).
        """
        order: Dict[int, List[int]] = {s: [] for s in range(self.num_stages)}
        for actions in self.ranks:
            for action in actions:
                if action.op in ("backward_weight", "backward"):
                    order[action.stage].append(action.microbatch)
        return order


def _fail(path: str, where: str, what: str, got: Any) -> RunError:
    return RunError(f"hp_recompute.run: {path}: {where}: expected {what}, got '{json.dumps(got)}'")


def _int(path: str, obj: Dict[str, Any], key: str, where: str, low: int = 0, high: Optional[int] = None) -> int:
    value = obj.get(key)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value < high
    if not ok:
        bound = f" in [{low}, {high})" if high is not None else f" >= {low}"
        raise _fail(path, f"{where}/{key}", f"an integer{bound}", value)
    return value


def load_plan(path: str) -> Plan:
    """Reads and checks the plan file ``path``."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise RunError(f"hp_recompute.run: cannot read plan '{path}': {e.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise RunError(f"hp_recompute.run: {path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    return parse_plan(raw, path)


def parse_plan(raw: Any, path: str = "<plan>") -> Plan:
    """Checks the runner's subset of plan JSON version 2 and returns a ``Plan``."""
    if not isinstance(raw, dict):
        raise _fail(path, "/", "a JSON object", raw)
    if raw.get("format") != "hp-recompute-plan":
        raise _fail(path, "/format", "'hp-recompute-plan'", raw.get("format"))
    if raw.get("version") == 1:
        raise RunError(f"hp_recompute: {path}: /version: plan version 1 does not say where graphs are freed or "
                       f"how messages are tagged; write the plan again with hp-recompute-plan --emit json")
    if raw.get("version") != 2:
        raise _fail(path, "/version", "2", raw.get("version"))
    sched = raw.get("schedule")
    if not isinstance(sched, dict):
        raise _fail(path, "/schedule", "an object", sched)
    num_ranks = _int(path, sched, "num_ranks", "/schedule", 1)
    num_stages = _int(path, sched, "num_stages", "/schedule", 1)
    num_mb = _int(path, sched, "num_microbatches", "/schedule", 1)
    s2r = sched.get("stage_to_rank")
    if not isinstance(s2r, list) or len(s2r) != num_stages:
        raise _fail(path, "/schedule/stage_to_rank", f"a list of {num_stages} ranks", s2r)
    for i, r in enumerate(s2r):
        if not isinstance(r, int) or not 0 <= r < num_ranks:
            raise _fail(path, f"/schedule/stage_to_rank/{i}", f"a rank in [0, {num_ranks})", r)

    model = raw.get("model")
    stages_raw = model.get("stages") if isinstance(model, dict) else None
    if not isinstance(stages_raw, list) or len(stages_raw) != num_stages:
        raise _fail(path, "/model/stages", f"a list of {num_stages} stages", stages_raw)
    stages: List[List[Dict[str, Any]]] = []
    for i, st in enumerate(stages_raw):
        regions = st.get("regions") if isinstance(st, dict) else None
        if not isinstance(regions, list) or not regions:
            raise _fail(path, f"/model/stages/{i}/regions", "a non-empty list", regions)
        for j, region in enumerate(regions):
            if not isinstance(region, dict) or not isinstance(region.get("name"), str):
                raise _fail(path, f"/model/stages/{i}/regions/{j}/name", "a string", region)
            if not isinstance(region.get("checkpoint", False), bool):
                raise _fail(path, f"/model/stages/{i}/regions/{j}/checkpoint", "a boolean", region.get("checkpoint"))
        stages.append(regions)

    sessions: Dict[str, Dict[str, Any]] = {}
    for i, sess in enumerate(raw.get("sessions", [])):
        if not isinstance(sess, dict) or not isinstance(sess.get("id"), str):
            raise _fail(path, f"/sessions/{i}/id", "a string", sess)
        _int(path, sess, "stage", f"/sessions/{i}", 0, num_stages)
        _int(path, sess, "microbatch", f"/sessions/{i}", 0, num_mb)
        sessions[sess["id"]] = sess
    session_of = {(sess["stage"], sess["microbatch"]): sid for sid, sess in sessions.items()}

    ranks_raw = raw.get("ranks")
    if not isinstance(ranks_raw, list) or len(ranks_raw) != num_ranks:
        raise _fail(path, "/ranks", f"a list of {num_ranks} ranks", ranks_raw)
    ranks: List[List[Action]] = []
    for r, rank in enumerate(ranks_raw):
        acts = rank.get("actions") if isinstance(rank, dict) else None
        if not isinstance(acts, list):
            raise _fail(path, f"/ranks/{r}/actions", "a list", acts)
        out: List[Action] = []
        for i, a in enumerate(acts):
            where = f"/ranks/{r}/actions/{i}"
            if not isinstance(a, dict) or a.get("op") not in ALL_OPS:
                raise _fail(path, f"{where}/op", "one of " + " ".join(ALL_OPS), a.get("op") if isinstance(a, dict) else a)
            op = a["op"]
            kw: Dict[str, Any] = {"op": op, "overlap": bool(a.get("overlap", False))}
            if op not in NOOP_OPS:
                kw["stage"] = _int(path, a, "stage", where, 0, num_stages)
                kw["microbatch"] = _int(path, a, "microbatch", where, 0, num_mb)
            elif "stage" in a:  # unshard, reshard, reduce_grad: per stage, no microbatch
                kw["stage"] = _int(path, a, "stage", where, 0, num_stages)
            if kw.get("stage", -1) >= 0 and s2r[kw["stage"]] != r:
                raise _fail(path, f"{where}/stage", f"a stage on rank {r}", kw["stage"])
            if op in TRANSFER_OPS:
                kw["peer"] = _int(path, a, "peer", where, 0, num_ranks)
                if "tag" in a:  # the torch CSV has none: torch's ops are untagged
                    kw["tag"] = _int(path, a, "tag", where, 0)
            if "frees_graph" in a:
                if op not in CONSUMER_OPS or a["frees_graph"] is not True:
                    raise _fail(path, f"{where}/frees_graph", "true, on a backward", a["frees_graph"])
                kw["frees_graph"] = True
            if "checkpoint" in a:
                if op != "forward" or a["checkpoint"] is not False:
                    raise _fail(path, f"{where}/checkpoint", "false, on a forward", a["checkpoint"])
                if (kw["stage"], kw["microbatch"]) in session_of:
                    raise _fail(path, f"{where}/checkpoint", "no session for a plain forward",
                                session_of[(kw["stage"], kw["microbatch"])])
                kw["plain"] = True
            sid = a.get("session")
            if op in ("recompute", "clear") and sid is None:
                raise _fail(path, f"{where}/session", "a session id", sid)
            if sid is not None:
                if sid not in sessions:
                    raise _fail(path, f"{where}/session", "an id listed in /sessions", sid)
                kw["session"] = sid
                retain = a.get("retain_on_unpack", False)
                if not isinstance(retain, bool):
                    raise _fail(path, f"{where}/retain_on_unpack", "a boolean", retain)
                kw["retain_on_unpack"] = retain
            out.append(Action(**kw))
        ranks.append(out)
    return Plan(path=path, raw=raw, name=str(sched.get("name", "?")), num_ranks=num_ranks, num_stages=num_stages,
                num_microbatches=num_mb, stage_to_rank=list(s2r), stages=stages, sessions=sessions, ranks=ranks,
                summary=_summary(path, raw.get("summary", {}), num_ranks))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


def _summary(path: str, summary: Any, num_ranks: int) -> Dict[str, Any]:
    """The summary fields the runner compares with: numbers, or one number per rank."""
    if not isinstance(summary, dict):
        raise _fail(path, "/summary", "an object", summary)
    for key in ("step_time_us", "recomputes", "per_backward_recomputes"):
        if key in summary and not _number(summary[key]):
            raise _fail(path, f"/summary/{key}", "a finite number", summary[key])
    for key in ("busy_us", "peak_bytes", "peak_memory_bytes"):
        if key in summary:
            values = summary[key]
            if not isinstance(values, list) or len(values) != num_ranks or not all(map(_number, values)):
                raise _fail(path, f"/summary/{key}", f"a list of {num_ranks} finite numbers", values)
    return dict(summary)
