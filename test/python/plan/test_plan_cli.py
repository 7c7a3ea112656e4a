"""End-to-end tests of hp-recompute-plan: plans checked against the schema and
against the session contract, re-derived in Python."""

from __future__ import annotations

import json

import jsonschema
import pytest

from plan_cli import (
    SCHEDULES,
    SCHEMA,
    check_lifecycles,
    compute_order,
    csv_compute_order,
    plan_json,
    run_plan,
)

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))

GENERATED = [
    ("gpipe", 4, 8),
    ("1f1b", 4, 8),
    ("interleaved-1f1b", 2, 4),
    ("zb-h1", 4, 8),
    ("zbv", 4, 8),
    ("zbv", 2, 4),
    ("dualpipev", 4, 8),
]


def test_default_run_prints_summary():
    out = run_plan().stdout
    assert "schedule 'zbv' (4 ranks, 8 stages, 8 microbatches)" in out
    assert out.splitlines()[1].split()[:3] == ["rank", "actions", "sessions"]
    assert any(line.startswith("total") for line in out.splitlines())


def test_default_json_uses_bundled_gpt():
    plan = plan_json()
    VALIDATOR.validate(plan)
    names = [r["name"] for s in plan["model"]["stages"] for r in s["regions"]]
    assert sum(name.startswith("blocks.") or name.startswith("layers.") for name in names) == 8
    check_lifecycles(plan)


@pytest.mark.parametrize("name,ranks,mbs", GENERATED)
@pytest.mark.parametrize("prefetch", ["jit", "lookahead=2"])
def test_generated_plans_are_valid(name, ranks, mbs, prefetch):
    plan = plan_json(
        "--schedule-gen", name, "--ranks", str(ranks), "--microbatches", str(mbs),
        "--prefetch", prefetch,
    )
    VALIDATOR.validate(plan)
    check_lifecycles(plan)
    # The synthetic uniform model checkpoints every stage: one session per
    # (stage, microbatch).
    schedule = plan["schedule"]
    assert len(plan["sessions"]) == schedule["num_stages"] * schedule["num_microbatches"]
    assert plan["summary"]["recomputes"] == len(plan["sessions"])


def test_split_backward_needs_half_the_recomputes():
    # Per-backward checkpointing replays for each of I and W, but the first stage's I reads nothing:
    # 8 stages x 8 microbatches, of which stage 0's 8 are read once.
    zbv = plan_json("--schedule-gen", "zbv", "--ranks", "4", "--microbatches", "8")["summary"]
    assert zbv["recomputes"] == 64
    assert zbv["per_backward_recomputes"] == 2 * 64 - 8
    onef1b = plan_json("--schedule-gen", "1f1b", "--ranks", "4", "--microbatches", "8")["summary"]
    assert onef1b["per_backward_recomputes"] == onef1b["recomputes"]


def test_lookahead_keeps_more_sessions_alive():
    args = ("--schedule-gen", "zbv", "--ranks", "4", "--microbatches", "8")
    jit = plan_json(*args)["summary"]
    ahead = plan_json(*args, "--prefetch", "lookahead=3")["summary"]
    assert max(ahead["max_live_sessions"]) >= max(jit["max_live_sessions"])
    assert max(ahead["peak_bytes"]) >= max(jit["peak_bytes"])


@pytest.mark.parametrize(
    "csv,dialect",
    [
        ("pytorch-dualpipev-4rank-10mb.csv", "current"),
        ("pytorch-zb1p-2rank-2stagep-compute.csv", "legacy"),
        ("pytorch-zb1p-2rank-2stagep-comms.csv", "legacy"),
    ],
)
def test_pytorch_artifacts_plan_once_per_session(csv, dialect):
    path = SCHEDULES / csv
    plan = plan_json("--schedule", str(path), "--schedule-dialect", dialect)
    VALIDATOR.validate(plan)
    check_lifecycles(plan)
    stages = plan["schedule"]["num_stages"]
    assert len(plan["sessions"]) == stages * plan["schedule"]["num_microbatches"]
    assert compute_order(plan) == csv_compute_order(path, dialect)


def test_csv_output_round_trips_with_recompute_and_clear(tmp_path):
    out = tmp_path / "plan.csv"
    run_plan("--schedule-gen", "1f1b", "--ranks", "2", "--microbatches", "2",
             "--emit", "csv", "-o", str(out))
    rows = out.read_text().splitlines()
    assert len(rows) == 2
    assert "1RECOMPUTE0" in rows[1].split(",")
    assert "1CLEAR0" in rows[1].split(",")
    cells = rows[1].split(",")
    assert cells.index("1RECOMPUTE0") < cells.index("1B0") < cells.index("1CLEAR0")


def test_memory_budget_rejects_plan_and_writes_nothing(tmp_path):
    out = tmp_path / "plan.json"
    # 0 bytes: no pass plans within it (a 1-byte budget plans: the unit-cost stages' dws
    # fuse with their dx), and the finished plan is checked against it.
    proc = run_plan("--schedule-gen", "zbv", "--ranks", "2", "--microbatches", "4",
                    "--memory-budget", "0B", "--emit", "json", "-o", str(out), check=False)
    assert proc.returncode == 1
    assert "plan exceeds --memory-budget: rank 0 needs 1 bytes of activations, budget 0" in proc.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_zbv_5x11_matches_pytorch_once_planner_actions_are_removed():
    """The generated ZBV schedule, as the CLI emits it, is PyTorch's action for
    action: drop the planner's and the lowerings' cells (transfers, REDUCE_GRAD) and compare."""
    out = run_plan("--schedule-gen", "zbv", "--ranks", "5", "--microbatches", "11",
                   "--emit", "csv").stdout
    added = ("RECOMPUTE", "CLEAR", "SEND_", "RECV_", "REDUCE_GRAD")
    planned = [
        [cell for cell in row.split(",") if not any(a in cell for a in added)]
        for row in out.splitlines()
    ]
    reference = [row.split(",") for row in (SCHEDULES / "pytorch-zbv-5x11.csv").read_text().splitlines()]
    assert planned == reference


@pytest.mark.parametrize("name,ranks,mbs", [("zbv", 2, 4), ("dualpipev", 2, 4), ("1f1b", 3, 6)])
def test_trace_is_a_consistent_timeline(name, ranks, mbs):
    args = ("--schedule-gen", name, "--ranks", str(ranks), "--microbatches", str(mbs))
    trace = json.loads(run_plan(*args, "--emit", "trace").stdout)
    plan = plan_json(*args)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    by_rank = {}
    for event in events:
        by_rank.setdefault(event["tid"], []).append(event)
    assert sorted(by_rank) == list(range(ranks))
    for rank, rank_events in by_rank.items():
        # A rank runs one action at a time.
        for before, after in zip(rank_events, rank_events[1:]):
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-9
        recomputes = [e for e in rank_events if "RECOMPUTE" in e["name"]]
        planned = [a for a in plan["ranks"][rank]["actions"] if a["op"] == "recompute"]
        assert len(recomputes) == len(planned)
    end = max(e["ts"] + e["dur"] for e in events)
    assert end == pytest.approx(plan["summary"]["step_time_us"])
