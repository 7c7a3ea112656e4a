"""Reading a plan JSON (docs/plan-format.md) for the runner, with located errors.

Why a separate module: the runner trusts nothing upstream (DESIGN: runtimes read the
plan and nothing else), so it checks the fields it relies on and reports the JSON path
of the first bad one, the way the C++ tools do (``p.json: /ranks/1/actions/4/peer: ...``).
Hostile files get located errors too, never a traceback: bytes that are not UTF-8 and JSON
nested too deep by line and column, integers too long for Python and ``NaN`` at the JSON
path of the field that refuses them; booleans are not integers. A torch CSV's reader passes
``locate`` so that a path of the plan it builds is reported as the CSV cell or sidecar
entry it came from.
The full schema lives in docs/schemas/plan.schema.json; this is the runner's subset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["RunError", "Action", "Plan", "expected", "int_field", "load_plan", "parse_plan", "read_json", "read_text"]

COMPUTE_OPS = ("forward", "backward_input", "backward_weight", "backward")
CONSUMER_OPS = ("backward_input", "backward_weight", "backward")
TRANSFER_OPS = ("send_f", "recv_f", "send_b", "recv_b")
NOOP_OPS = ("unshard", "reshard", "reduce_grad", "idle")
ALL_OPS = COMPUTE_OPS + ("recompute", "clear") + TRANSFER_OPS + NOOP_OPS
#: Maps a JSON path of the plan (``/ranks/1/actions/4/peer``) to the place a user can find it:
#: ``p.json: /ranks/1/actions/4/peer`` for plan JSON, a CSV cell for a torch CSV.
Locate = Callable[[str], str]
#: Names where action ``index`` of ``rank`` came from, for the admission check's messages.
Origin = Callable[[int, int], str]


class RunError(RuntimeError):
    """A runtime error; the message starts with ``hp_recompute:`` (``hp_recompute.run:`` from the runner's
    own checks) and says what to fix."""


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
    #: A receive: the indices (into its rank's actions) of the receives to post when it is reached, in
    #: posting order (plan ``posts``; docs/plan-format.md); empty for every other action.
    posts: Tuple[int, ...] = ()

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
    #: Transfers carry message tags (plan JSON); False for a torch CSV (torch's ops are untagged).
    tagged: bool = True
    #: Where an action came from when it is not ``/ranks/R/actions/I`` of ``path`` (a torch CSV cell).
    origin: Optional[Origin] = None

    def where(self, rank: int, index: int) -> str:
        """``rank 1 action 5 (recv_f stage 1 mb 1 peer 0)``, and the CSV cell it came from if any."""
        text = f"rank {rank} action {index} ({self.ranks[rank][index].describe()})"
        return text if self.origin is None else f"{text}, {self.origin(rank, index)}"

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


#: Deeper than any plan nests (6 levels); Python's parser would overflow its stack first.
MAX_JSON_DEPTH = 100


class _LongInteger(float):
    """An integer too long for ``int()`` (Python refuses over 4300 digits): kept as +inf, so every
    field check refuses it at its JSON path (not an ``int``, not finite) instead of the parser
    raising without one."""

    def __new__(cls, digits: str) -> "_LongInteger":
        value = super().__new__(cls, "inf")
        value.digits = len(digits.lstrip("-"))
        return value


def _parse_int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return _LongInteger(text)


def _show(got: Any) -> str:
    """``got`` as the error prints it: JSON, cut short (a bad field can be a whole subtree)."""
    if isinstance(got, _LongInteger):
        return f"an integer of {got.digits} digits"
    text = json.dumps(got)
    return text if len(text) <= 80 else text[:77] + "..."


def expected(where: str, what: str, got: Any) -> RunError:
    """The error for a bad field: ``where`` (a located JSON path), what it should be, what it is."""
    return RunError(f"hp_recompute: {where}: expected {what}, got '{_show(got)}'")


def _is_int(value: Any) -> bool:
    """JSON integers only: ``true`` is not 1 (``bool`` is an ``int`` in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_field(at: Locate, obj: Dict[str, Any], key: str, where: str, low: int = 0, high: Optional[int] = None) -> int:
    """``obj[key]`` (at JSON path ``where/key``) as an integer in [low, high); booleans are not integers."""
    value = obj.get(key)
    ok = _is_int(value) and value >= low
    if ok and high is not None:
        ok = value < high
    if not ok:
        bound = f" in [{low}, {high})" if high is not None else f" >= {low}"
        raise expected(at(f"{where}/{key}"), f"an integer{bound}", value)
    return value


def _bool(at: Locate, obj: Dict[str, Any], key: str, where: str) -> bool:
    """An optional boolean field (absent: false); ``"false"`` is a string, not false."""
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise expected(at(f"{where}/{key}"), "a boolean", value)
    return value


def _line_col(data: bytes, offset: int) -> Tuple[int, int]:
    line_start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, offset - line_start + 1


#: The largest text input read (a plan, a torch CSV or sidecar, a run report, a model JSON):
#: a device such as /dev/zero is refused, not read until memory runs out.
MAX_INPUT_BYTES = 256 << 20


def read_text(path: str, what: str) -> str:
    """The UTF-8 text of ``path`` (``what``: "plan", "torch CSV", ...); a located error on a bad
    byte, and an error naming the file past ``MAX_INPUT_BYTES``."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise RunError(f"hp_recompute: cannot read {what} '{path}': {e.strerror}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise RunError(f"hp_recompute: {path}: the {what} is larger than {MAX_INPUT_BYTES} bytes; "
                       f"expected a {what} file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, col = _line_col(data, e.start)
        raise RunError(f"hp_recompute: {path}:{line}:{col}: invalid UTF-8 (byte 0x{data[e.start]:02x}); "
                       f"expected UTF-8 text") from None


def _too_deep(text: str) -> Tuple[int, int]:
    """Line and column of the first bracket nested deeper than ``MAX_JSON_DEPTH`` (outside strings)."""
    depth, in_string, escaped, line, col = 0, False, False, 1, 0
    for ch in text:
        col += 1
        if ch == "\n":
            line, col = line + 1, 0
        elif escaped:
            escaped = False
        elif in_string:
            escaped, in_string = ch == "\\", ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return line, col
        elif ch in "]}":
            depth -= 1
    return line, col


def read_json(path: str, what: str) -> Any:
    """Parses the JSON file ``path``; every failure is a ``RunError`` located in the file.

    Integers too long for Python are kept as ``_LongInteger`` for the field checks to
    refuse; ``NaN`` and ``Infinity`` (which Python's parser accepts) are floats that no
    integer or string field takes, and the finite-number checks refuse.
    """
    text = read_text(path, what)
    try:
        return json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise RunError(f"hp_recompute: {path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        line, col = _too_deep(text)
        raise RunError(f"hp_recompute: {path}:{line}:{col}: JSON nested deeper than {MAX_JSON_DEPTH} levels; "
                       f"a {what} nests a few levels") from None


def load_plan(path: str) -> Plan:
    """Reads and checks the plan file ``path``."""
    return parse_plan(read_json(path, "plan"), path)


def parse_plan(raw: Any, path: str = "<plan>", *, tagged: bool = True, locate: Optional[Locate] = None,
               origin: Optional[Origin] = None) -> Plan:
    """Checks the runner's subset of plan JSON version 2 and returns a ``Plan``.

    Args:
        raw: the parsed JSON.
        path: the file, for messages.
        tagged: whether every transfer carries a message tag (plan JSON); a plan built from a
            torch CSV has none (torch's point-to-point ops are untagged) and passes False.
        locate: where a JSON path of ``raw`` is in the user's files (default ``PATH: /json/path``).
        origin: where an action came from, for the admission check (``Plan.where``).
    """
    at: Locate = locate or (lambda where: f"{path}: {where}")
    if not isinstance(raw, dict):
        raise expected(at("/"), "a JSON object", raw)
    if raw.get("format") != "hp-recompute-plan":
        raise expected(at("/format"), "'hp-recompute-plan'", raw.get("format"))
    if raw.get("version") == 1 and not isinstance(raw.get("version"), bool):
        raise RunError(f"hp_recompute: {at('/version')}: plan version 1 does not say where graphs are freed or "
                       f"how messages are tagged; write the plan again with hp-recompute-plan --emit json")
    if not _is_int(raw.get("version")) or raw.get("version") != 2:
        raise expected(at("/version"), "2", raw.get("version"))
    sched = raw.get("schedule")
    if not isinstance(sched, dict):
        raise expected(at("/schedule"), "an object", sched)
    num_ranks = int_field(at, sched, "num_ranks", "/schedule", 1)
    num_stages = int_field(at, sched, "num_stages", "/schedule", 1)
    num_mb = int_field(at, sched, "num_microbatches", "/schedule", 1)
    s2r = sched.get("stage_to_rank")
    if not isinstance(s2r, list) or len(s2r) != num_stages:
        raise expected(at("/schedule/stage_to_rank"), f"a list of {num_stages} ranks", s2r)
    for i, r in enumerate(s2r):
        if not _is_int(r) or not 0 <= r < num_ranks:
            raise expected(at(f"/schedule/stage_to_rank/{i}"), f"a rank in [0, {num_ranks})", r)

    model = raw.get("model")
    stages_raw = model.get("stages") if isinstance(model, dict) else None
    if not isinstance(stages_raw, list) or len(stages_raw) != num_stages:
        raise expected(at("/model/stages"), f"a list of {num_stages} stages", stages_raw)
    stages: List[List[Dict[str, Any]]] = []
    for i, st in enumerate(stages_raw):
        regions = st.get("regions") if isinstance(st, dict) else None
        if not isinstance(regions, list) or not regions:
            raise expected(at(f"/model/stages/{i}/regions"), "a non-empty list", regions)
        for j, region in enumerate(regions):
            if not isinstance(region, dict) or not isinstance(region.get("name"), str):
                raise expected(at(f"/model/stages/{i}/regions/{j}/name"), "a string", region)
            _bool(at, region, "checkpoint", f"/model/stages/{i}/regions/{j}")
        stages.append(regions)

    sessions = _sessions(at, raw.get("sessions", []), s2r, num_mb)
    session_of = {(sess["stage"], sess["microbatch"]): sid for sid, sess in sessions.items()}

    ranks_raw = raw.get("ranks")
    if not isinstance(ranks_raw, list) or len(ranks_raw) != num_ranks:
        raise expected(at("/ranks"), f"a list of {num_ranks} ranks", ranks_raw)
    ranks: List[List[Action]] = []
    for r, rank in enumerate(ranks_raw):
        acts = rank.get("actions") if isinstance(rank, dict) else None
        if not isinstance(acts, list):
            raise expected(at(f"/ranks/{r}/actions"), "a list", acts)
        out: List[Action] = []
        for i, a in enumerate(acts):
            where = f"/ranks/{r}/actions/{i}"
            if not isinstance(a, dict) or not isinstance(a.get("op"), str) or a["op"] not in ALL_OPS:
                raise expected(at(f"{where}/op"), "one of " + " ".join(ALL_OPS),
                               a.get("op") if isinstance(a, dict) else a)
            op = a["op"]
            kw: Dict[str, Any] = {"op": op, "overlap": _bool(at, a, "overlap", where)}
            if op not in NOOP_OPS:
                kw["stage"] = int_field(at, a, "stage", where, 0, num_stages)
                kw["microbatch"] = int_field(at, a, "microbatch", where, 0, num_mb)
            elif "stage" in a or op == "reduce_grad":  # per stage, no microbatch (a reduce_grad needs its stage)
                kw["stage"] = int_field(at, a, "stage", where, 0, num_stages)
            if kw.get("stage", -1) >= 0 and s2r[kw["stage"]] != r:
                raise expected(at(f"{where}/stage"), f"a stage on rank {r}", kw["stage"])
            if op in TRANSFER_OPS:
                kw["peer"] = int_field(at, a, "peer", where, 0, num_ranks)
                if tagged:
                    kw["tag"] = int_field(at, a, "tag", where, 0)
                elif "tag" in a:
                    raise expected(at(f"{where}/tag"), "no tag (torch's point-to-point ops carry none)", a["tag"])
            if "posts" in a:
                posts = a["posts"]
                if op not in ("recv_f", "recv_b"):
                    raise expected(at(f"{where}/posts"), "no posts (only a receive posts receives)", posts)
                if not isinstance(posts, list):
                    raise expected(at(f"{where}/posts"), "a list of action indices", posts)
                for k, index in enumerate(posts):
                    if not _is_int(index) or not 0 <= index < len(acts):
                        raise expected(at(f"{where}/posts/{k}"), f"an action index of rank {r} in [0, {len(acts)})",
                                       index)
                kw["posts"] = tuple(posts)
            if "frees_graph" in a:
                if op not in CONSUMER_OPS or a["frees_graph"] is not True:
                    raise expected(at(f"{where}/frees_graph"), "true, on a backward", a["frees_graph"])
                kw["frees_graph"] = True
            if "checkpoint" in a:
                if op != "forward" or a["checkpoint"] is not False:
                    raise expected(at(f"{where}/checkpoint"), "false, on a forward", a["checkpoint"])
                if (kw["stage"], kw["microbatch"]) in session_of:
                    raise expected(at(f"{where}/checkpoint"), "no session for a plain forward",
                                session_of[(kw["stage"], kw["microbatch"])])
                kw["plain"] = True
            sid = a.get("session")
            if op in ("recompute", "clear") and sid is None:
                raise expected(at(f"{where}/session"), "a session id", sid)
            if sid is not None:
                if not isinstance(sid, str) or sid not in sessions:
                    raise expected(at(f"{where}/session"), "an id listed in /sessions", sid)
                kw["session"] = sid
                kw["retain_on_unpack"] = _bool(at, a, "retain_on_unpack", where)
            out.append(Action(**kw))
        ranks.append(out)
    return Plan(path=path, raw=raw, name=str(sched.get("name", "?")), num_ranks=num_ranks, num_stages=num_stages,
                num_microbatches=num_mb, stage_to_rank=list(s2r), stages=stages, sessions=sessions, ranks=ranks,
                summary=_summary(at, raw.get("summary", {}), num_ranks), tagged=tagged, origin=origin)


def _sessions(at: Locate, raw: Any, s2r: List[int], num_mb: int) -> Dict[str, Dict[str, Any]]:
    """``/sessions``: unique string ids, one session per (stage, microbatch), on the stage's rank if it says."""
    if not isinstance(raw, list):
        raise expected(at("/sessions"), "a list of sessions", raw)
    sessions: Dict[str, Dict[str, Any]] = {}
    first: Dict[Any, int] = {}  # id, and (stage, microbatch) -> index in /sessions
    for i, sess in enumerate(raw):
        if not isinstance(sess, dict) or not isinstance(sess.get("id"), str):
            raise expected(at(f"/sessions/{i}/id"), "a string", sess.get("id") if isinstance(sess, dict) else sess)
        sid = sess["id"]
        if sid in sessions:
            raise expected(at(f"/sessions/{i}/id"), f"an id not used before (/sessions/{first[sid]} has it)", sid)
        key = (int_field(at, sess, "stage", f"/sessions/{i}", 0, len(s2r)),
               int_field(at, sess, "microbatch", f"/sessions/{i}", 0, num_mb))
        if key in first:
            raise expected(at(f"/sessions/{i}"), f"one session per stage and microbatch (/sessions/{first[key]} is "
                                              f"stage {key[0]} mb {key[1]}'s)", sid)
        if "rank" in sess:
            int_field(at, sess, "rank", f"/sessions/{i}", 0)
        first[sid], first[key] = i, i
        sessions[sid] = sess
    return sessions


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


def _summary(at: Locate, summary: Any, num_ranks: int) -> Dict[str, Any]:
    """The summary fields the runner compares with: numbers, or one number per rank."""
    if not isinstance(summary, dict):
        raise expected(at("/summary"), "an object", summary)
    for key in ("step_time_us", "recomputes", "per_backward_recomputes"):
        if key in summary and not _number(summary[key]):
            raise expected(at(f"/summary/{key}"), "a finite number", summary[key])
    for key in ("busy_us", "peak_bytes", "peak_memory_bytes"):
        if key in summary:
            values = summary[key]
            if not isinstance(values, list) or len(values) != num_ranks or not all(map(_number, values)):
                raise expected(at(f"/summary/{key}"), f"a list of {num_ranks} finite numbers", values)
    return dict(summary)
