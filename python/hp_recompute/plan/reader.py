"""The runtime's view of a plan (docs/plan-format.md), and the readers of JSON inputs.

Why no checks of the plan here: a plan is admitted by the C++ planner's own reader and
verifier first (``plan.verify.admit_plan``: every member, every rule, located at its JSON
path, the CLI's words), so ``build_plan`` only turns an admitted plan into the objects
the runtimes execute. What stays here is what is not a planner rule: reading JSON files
with located errors (bytes that are not UTF-8 and JSON nested too deep by line and
column, integers too long for Python and ``NaN`` at the JSON path of the field that
refuses them), for the inputs no planner reads (run reports, model
JSON given to the runtimes); the ops a runtime can execute; and the runner's report
fields (``/summary``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..errors import RunError
from ..selective import selective_supported

__all__ = ["Action", "Plan", "build_plan", "expected", "read_json", "read_text", "region_checkpoint"]

COMPUTE_OPS = ("forward", "backward_input", "backward_weight", "backward")
CONSUMER_OPS = ("backward_input", "backward_weight", "backward")
TRANSFER_OPS = ("send_f", "recv_f", "send_b", "recv_b")
NOOP_OPS = ("unshard", "reshard", "reduce_grad", "idle")
ALL_OPS = COMPUTE_OPS + ("recompute", "clear") + TRANSFER_OPS + NOOP_OPS
#: Maps a JSON path of the plan (``/ranks/1/actions/4/peer``) to the place a user can find it:
#: ``p.json: /ranks/1/actions/4/peer`` for plan JSON, a CSV cell for a torch CSV.
Locate = Callable[[str], str]


@dataclass(frozen=True)
class Action:
    """One planned action of a rank (only the fields the runner uses)."""

    op: str
    stage: int = -1
    microbatch: int = -1
    session: Optional[str] = None
    retain_on_unpack: bool = False
    #: A recompute whose replay runs inside its session's one ``backward``, region by region (plan
    #: ``in_backward``; hpr.exec.in-backward).
    in_backward: bool = False
    #: A recompute that is a piece of its session's replay: the indices, into the session's ``regions``,
    #: of the checkpointed regions it replays (plan ``regions``; hpr.exec.replay-in-pieces); empty
    #: when it replays them all.
    regions: Tuple[int, ...] = ()
    #: A recompute after its session's dx that replays again what the dw reads (plan ``for_weight``;
    #: hpr.exec.replay-for-weight).
    for_weight: bool = False
    #: A ``backward_input`` whose session drops its replay at its end, to replay again for its dw (plan
    #: ``drops_replay``; hpr.exec.replay-for-weight).
    drops_replay: bool = False
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
    #: A forward, ``backward_input`` or ``backward``: the indices of the receives whose data it reads, which it
    #: waits for (plan ``waits``); empty when it reads none.
    waits: Tuple[int, ...] = ()
    #: The stage's last ``backward_weight`` or ``backward`` on its rank (plan ``last_backward``).
    last_backward: bool = False
    #: A forward, ``backward_input`` or ``backward``: the stage on this rank its output (input gradient) is handed
    #: to in memory (plan ``hands_to``); -1 when a transfer carries it, or nothing does.
    hands_to: int = -1

    def describe(self) -> str:
        """Short text such as ``backward_input stage 3 mb 0 session s3.mb0``."""
        text = self.op
        if self.stage >= 0:
            text += f" stage {self.stage}"
        if self.microbatch >= 0:
            text += f" mb {self.microbatch}"
        if self.session is not None:
            text += f" session {self.session}"
        if self.for_weight:
            text += " for_weight"
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
    #: Every transfer carries a message tag (plan JSON); False for a torch CSV (torch's ops are untagged).
    tagged: bool = True

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


def region_checkpoint(region: Dict[str, Any]) -> str:
    """A plan region's checkpoint policy: ``"none"``, ``"full"`` or ``"selective"`` (its JSON
    ``checkpoint``: false, true or "selective"; NOTE [ Selective policy ]). Raises ``ValueError``
    for any other value (an admitted plan has none; ``--from-run`` reads plans unadmitted)."""
    value = region.get("checkpoint", False)
    if value is False:
        return "none"
    if value is True:
        return "full"
    if value == "selective":
        return "selective"
    raise ValueError(f"region '{region.get('name')}': checkpoint: expected false, true or \"selective\", "
                     f"got {value!r}")


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


def build_plan(raw: Dict[str, Any], path: str) -> Plan:
    """The runtime's view of ``raw``, a plan the admission check accepted (``plan.verify.admit_plan``).

    Checks only what no planner rule covers: that this runtime executes every op (an op
    it skipped would be a silently wrong step) and every region's checkpoint policy
    (hpr.selective.supported), and the report fields of ``/summary``.
    """
    at: Locate = lambda where: f"{path}: {where}"  # noqa: E731
    stages = [stage["regions"] for stage in raw["model"]["stages"]]
    for s, regions in enumerate(stages):
        for j, region in enumerate(regions):
            if region_checkpoint(region) == "selective" and not selective_supported():
                raise RunError(f"{at(f'/model/stages/{s}/regions/{j}/checkpoint')}: region '{region['name']}' is "
                               f"checkpointed \"selective\", which needs torch >= 2.4 "
                               f"(create_selective_checkpoint_contexts); this is torch {torch.__version__}: plan "
                               f"with --checkpoint all instead")
    sched = raw["schedule"]
    ranks: List[List[Action]] = []
    for r, rank in enumerate(raw["ranks"]):
        actions: List[Action] = []
        for i, a in enumerate(rank["actions"]):
            if a["op"] not in ALL_OPS:
                raise expected(at(f"/ranks/{r}/actions/{i}/op"), "an op this runtime executes: " + " ".join(ALL_OPS),
                               a["op"])
            actions.append(Action(op=a["op"], stage=a.get("stage", -1), microbatch=a.get("microbatch", -1),
                                  session=a.get("session"), retain_on_unpack=a.get("retain_on_unpack", False),
                                  in_backward=a.get("in_backward", False), regions=tuple(a.get("regions", ())),
                                  for_weight=a.get("for_weight", False), drops_replay=a.get("drops_replay", False),
                                  peer=a.get("peer", -1), tag=a.get("tag", -1),
                                  frees_graph=a.get("frees_graph", False), overlap=a.get("overlap", False),
                                  plain=a.get("checkpoint") is False, posts=tuple(a.get("posts", ())),
                                  waits=tuple(a.get("waits", ())), last_backward=a.get("last_backward", False),
                                  hands_to=a.get("hands_to", -1)))
        ranks.append(actions)
    num_ranks = sched["num_ranks"]
    return Plan(path=path, raw=raw, name=str(sched.get("name", "?")), num_ranks=num_ranks,
                num_stages=sched["num_stages"], num_microbatches=sched["num_microbatches"],
                stage_to_rank=list(sched["stage_to_rank"]),
                stages=stages,
                sessions={s["id"]: s for s in raw.get("sessions", [])}, ranks=ranks,
                summary=_summary(at, raw.get("summary", {}), num_ranks),
                tagged=all(a.tag >= 0 for actions in ranks for a in actions if a.op in TRANSFER_OPS))


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
