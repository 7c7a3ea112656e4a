"""The selective policy end to end: measured, planned, run (NOTE [ Selective policy ]).

Costs measure each region under the selective checkpoint, the planner prices a
``--checkpoint selective`` plan with those costs, and the runner applies the policy: gradients
as a plain step's, and planned memory close to the allocator's, which the selective policy's
saved matmul outputs raise above the full checkpoint's (the replays' matmul count is tested
under PlannedSchedule, test_planned_schedule.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from hpr_run_util import GPT_MODEL_JSON, PLAN_TOOL, flags, gpt_factory, make_plan, measure_costs, run_cli
from hp_recompute.selective import selective_supported

needs_selective = pytest.mark.skipif(not selective_supported(), reason="selective checkpointing needs torch >= 2.4")
#: The bundled GPT's blocks on two stages, as test_run_checks fixes them.
GPT_STAGES = "0:0-4,1:5-9"


@pytest.fixture(scope="module")
def costed(tmp_path_factory) -> Path:
    return measure_costs(tmp_path_factory.mktemp("selective") / "gpt.costed.json", GPT_MODEL_JSON)


@needs_selective
def test_costs_measure_what_the_selective_policy_saves_and_replays(costed: Path) -> None:
    regions = {r["name"]: r for r in json.loads(costed.read_text())["regions"]}
    blocks = [r for r in regions.values() if r["checkpointable"]]
    assert blocks
    for r in blocks:
        # It saves the matmul outputs: more than the RNG states alone, less than everything.
        assert 0 < r["selective_saved_bytes"] < r["saved_bytes"], r
        # Its replay recomputes the rest only.
        assert 0 < r["selective_replay_bytes"] < r["replay_bytes"], r
        assert r["selective_replay_time_us"] > 0 and r["selective_fwd_time_us"] > 0, r


def test_selective_without_measured_costs_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([str(PLAN_TOOL), "--model", str(GPT_MODEL_JSON), "--schedule-gen", "1f1b", "--ranks", "2",
                           "--microbatches", "2", "--checkpoint", "selective", "-o", str(tmp_path / "p.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert ("--checkpoint selective: region 'blocks.0' has no measured selective costs (selective_replay_time_us); "
            "measure them with python -m hp_recompute.costs") in proc.stderr
    assert not (tmp_path / "p.json").exists()


@needs_selective
@pytest.mark.parametrize("cfg", [("1f1b", 2, 4), ("zbv", 2, 4)], ids=lambda c: c[0])
def test_a_selective_plan_runs_exact_and_its_memory_is_planned(tmp_path: Path, costed: Path, cfg) -> None:
    stages = GPT_STAGES if cfg[0] != "zbv" else "0:0-2,1:3-4,2:5-6,3:7-9"
    plans = {policy: make_plan(tmp_path, "--model", str(costed), "--stages", stages, "--checkpoint", policy,
                               *flags(cfg), name=f"{policy}.json") for policy in ("all", "selective")}
    raw = json.loads(plans["selective"].read_text())
    policies = {r["name"]: r["checkpoint"] for st in raw["model"]["stages"] for r in st["regions"]}
    assert {p for p in policies.values()} == {"selective", False}
    reports = {}
    for policy, plan in plans.items():
        report = tmp_path / f"{policy}.report.json"
        proc = run_cli("--plan", str(plan), "--steps", "2", "--report", str(report), timeout=300)
        assert proc.returncode == 0, proc.stderr  # gradients and loss checked against a plain step
        reports[policy] = json.loads(report.read_text())
    for rank in reports["selective"]["ranks"]:
        assert abs(rank["measured_over_planned"] - 1) <= 0.10, rank
    # Keeping the matmul outputs costs memory the full checkpoint does not keep.
    assert (max(raw["summary"]["peak_memory_bytes"])
            > max(json.loads(plans["all"].read_text())["summary"]["peak_memory_bytes"]))


@pytest.mark.skipif(selective_supported(), reason="this torch has selective checkpointing")
def test_a_selective_plan_is_refused_where_torch_lacks_it(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    raw = json.loads(make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), "--schedule-gen", "1f1b", "--ranks", "2",
                               "--microbatches", "2").read_text())
    raw["model"]["stages"][0]["regions"][1]["checkpoint"] = "selective"
    raw["model"]["stages"][0]["regions"][1]["selective_replay_time_us"] = 1.0
    plan.write_text(json.dumps(raw))
    proc = run_cli("--plan", str(plan), "--steps", "1")
    assert proc.returncode == 1, proc.stderr
    assert (f"{plan}: /model/stages/0/regions/1/checkpoint: region 'blocks.0' is checkpointed \"selective\", which "
            f"needs torch >= 2.4 (create_selective_checkpoint_contexts); this is torch {torch.__version__}"
            in proc.stderr)
    assert "Traceback" not in proc.stderr


@needs_selective
@pytest.mark.skipif(not hasattr(torch.nn.Module, "compile"), reason="nn.Module.compile needs torch >= 2.2")
def test_a_selective_plan_on_a_model_with_compiled_modules_is_refused(tmp_path: Path) -> None:
    """hpr.selective.visible-ops: the runner's regions are functions, so a model holding a
    module compiled where the policy cannot see its ops refuses a selective plan before any
    rank runs, naming the region and the module."""
    factory = gpt_factory(tmp_path, "model.blocks[1].compile()")
    raw = json.loads(make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), "--schedule-gen", "1f1b", "--ranks", "2",
                               "--microbatches", "2").read_text())
    raw["model"]["stages"][0]["regions"][1]["checkpoint"] = "selective"
    raw["model"]["stages"][0]["regions"][1]["selective_replay_time_us"] = 1.0
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(raw))
    proc = run_cli("--plan", str(plan), "--model", factory, "--steps", "1")
    assert proc.returncode == 1, proc.stderr
    assert (f"{plan}: /model/stages/0/regions/1/checkpoint: region 'blocks.0' is \"selective\", but model 'gpt' "
            f"holds compiled modules ('blocks.1') whose ops the policy cannot see; do not compile the model for the "
            f"runner, or plan the region in full [hpr.selective.visible-ops]"
            in proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr

