"""The planner from Python (``hp_recompute.make_plan`` / ``verify_plan``, the ``_planner`` extension)
against the CLI binary: the same plans, the same refusals, the same lines.

The CLI is the independent side here: a separate process built from the same sources by CMake
(build/), where the extension comes from the package's own build (pip install -e .).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hp_recompute as hr
from plan_cli import PLAN_TOOL, REPO, plan_json, run_plan

GPT = str(REPO / "examples" / "gpt" / "gpt.model.json")
pytestmark = pytest.mark.skipif(not PLAN_TOOL.exists(), reason="hp-recompute-plan is not built")

CASES = {
    "zbv bubble, costed model": (dict(schedule_gen="zbv", ranks=2, microbatches=4, model=GPT, prefetch="bubble"),
                                 ["--schedule-gen", "zbv", "--ranks", "2", "--microbatches", "4", "--model", GPT,
                                  "--prefetch", "bubble"]),
    "1f1b auto under a budget": (dict(schedule_gen="1f1b", ranks=4, model=GPT, checkpoint="auto",
                                      memory_budget=1447056, prefetch="bubble"),
                                 ["--schedule-gen", "1f1b", "--ranks", "4", "--model", GPT, "--checkpoint", "auto",
                                  "--memory-budget", "1447056", "--prefetch", "bubble"]),
    "1f1b auto + bubble within 1.5x the checkpoint-all peak": (
        dict(schedule_gen="1f1b", ranks=4, model=GPT, checkpoint="auto", memory_budget="1.5x", prefetch="bubble"),
        ["--schedule-gen", "1f1b", "--ranks", "4", "--model", GPT, "--checkpoint", "auto", "--memory-budget", "1.5x",
         "--prefetch", "bubble"]),
    "dualpipev lookahead, schedule alone": (dict(schedule_gen="dualpipev", ranks=4, microbatches=8,
                                                 prefetch="lookahead=2"),
                                            ["--schedule-gen", "dualpipev", "--ranks", "4", "--microbatches", "8",
                                             "--prefetch", "lookahead=2"]),
    "zbv bubble on HSDP stages": (dict(schedule_gen="zbv", ranks=2, microbatches=4, model=GPT, prefetch="bubble",
                                       dp_shard=2, dp_replicate=2),
                                  ["--schedule-gen", "zbv", "--ranks", "2", "--microbatches", "4", "--model", GPT,
                                   "--prefetch", "bubble", "--dp-shard", "2", "--dp-replicate", "2"]),
    "a torch CSV schedule file": (dict(schedule=str(REPO / "test" / "inputs" / "schedules" / "pytorch-zbv-5x11.csv")),
                                  ["--schedule", str(REPO / "test" / "inputs" / "schedules" / "pytorch-zbv-5x11.csv")]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_make_plan_is_the_plan_the_cli_writes(case: str) -> None:
    kwargs, flags = CASES[case]
    plan = hr.make_plan(**kwargs)
    assert plan == plan_json(*flags)
    if "dp_shard" in kwargs:  # the layout reached the planner: unshards in the plan
        assert any(a["op"] == "unshard" for rank in plan["ranks"] for a in rank["actions"])


def test_verify_plan_admits_the_planners_plan_and_refuses_an_edit_as_the_cli_does(tmp_path: Path) -> None:
    plan = hr.make_plan(schedule_gen="zbv", ranks=2, microbatches=4, model=GPT)
    hr.verify_plan(plan)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(plan))
    hr.verify_plan(path)
    broken = copy.deepcopy(plan)
    broken["ranks"][0]["actions"].insert(2, {"op": "reduce_grad", "stage": 0})
    problems = _refused_alike(broken, path)
    assert "REDUCE_GRAD before rank 0, action" in problems[0]


def _refused_alike(plan: dict, path: Path) -> list:
    """Writes ``plan`` to ``path``; verify_plan and ``hp-recompute-plan --verify`` must refuse
    it with the same lines (exit 1). Returns them."""
    path.write_text(json.dumps(plan))
    with pytest.raises(hr.PlanError) as info:
        hr.verify_plan(path)
    proc = run_plan("--verify", str(path), check=False)
    assert proc.returncode == 1
    assert info.value.problems == proc.stderr.splitlines()
    return info.value.problems


def test_a_plan_reading_sharded_parameters_is_refused_as_the_cli_does(tmp_path: Path) -> None:
    """Rule 13: with the first reshard of rank 0 moved to the front, its stage's actions
    read parameters that are sharded; the admission check every runtime uses says so."""
    plan = hr.make_plan(schedule_gen="zbv", ranks=2, microbatches=4, model=GPT, dp_shard=2)
    actions = plan["ranks"][0]["actions"]
    first = next(i for i, a in enumerate(actions) if a["op"] == "reshard")
    actions.insert(0, actions.pop(first))
    problems = _refused_alike(plan, tmp_path / "p.json")
    assert any("whose parameters are not unsharded here (rule 13)" in p for p in problems)


@pytest.mark.parametrize("kwargs,line", [
    (dict(schedule_gen="zbv", schedule="x.csv"), "usage: give one schedule"),
    (dict(), "usage: give one schedule"),
    (dict(schedule_gen="zbv", checkpoint="some"), "usage: --checkpoint: expected all, model, none, auto or selective, got 'some'"),
    (dict(schedule_gen="zbv", checkpoint="auto"), "usage: --checkpoint auto needs --memory-budget"),
    (dict(schedule_gen="zbv", prefetch="soon"), "usage: --prefetch: expected jit, lookahead=K or bubble, got 'soon'"),
    (dict(schedule_gen="zbv", memory_budget=-1), "usage: --memory-budget: expected bytes such as 24GiB, or a "
     "multiple of the checkpoint-all peak such as 1.5x, got '-1'"),
    (dict(schedule_gen="zbv", memory_budget="0x"), "usage: --memory-budget: expected bytes such as 24GiB, or a "
     "multiple of the checkpoint-all peak such as 1.5x, got '0x'"),
    (dict(schedule_gen="zbv", memory_budget=True), "usage: memory_budget: expected bytes (an int) or a str such as "
     "'24GiB' or '1.5x', got True"),
    (dict(schedule_gen="zbv", memory_budget=1.5), "usage: memory_budget: expected bytes (an int) or a str such as "
     "'24GiB' or '1.5x', got 1.5"),
    (dict(schedule_gen="zbv", dp_shard=0), "usage: --dp-shard: expected an integer between 1 and 1048576, got 0"),
    (dict(schedule_gen="zbv", dp_replicate=2.0), "usage: dp_replicate: expected a count (an int), got 2.0"),
    (dict(schedule_gen="zbv", model="gpt.pt"), "usage: gpt.pt: a TorchScript model is read by the CLI only"),
    (dict(schedule_gen="nosuch"), "nosuch: unknown schedule: expected one of gpipe"),
    (dict(schedule="/nonexistent/s.csv"), "/nonexistent/s.csv: cannot read schedule file"),
    (dict(schedule_gen="zbv", ranks=2, microbatches=4, model=GPT, memory_budget=1000),
     "plan exceeds --memory-budget: rank 0 needs"),
])
def test_a_refused_request_names_what_is_wrong(kwargs: dict, line: str) -> None:
    with pytest.raises(hr.PlanError) as info:
        hr.make_plan(**kwargs)
    assert any(line in problem for problem in info.value.problems), info.value.problems


def test_a_schedule_that_breaks_its_rules_is_located_at_its_cell(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0B0\n1B0,1F0\n")
    with pytest.raises(hr.PlanError) as info:
        hr.make_plan(schedule=str(bad))
    proc = run_plan("--schedule", str(bad), check=False)
    assert proc.returncode == 1
    assert f"{bad}: rank 1, action 0 (1B0)" in str(info.value)
    assert str(info.value).replace("hp_recompute: ", "") in proc.stderr


@pytest.mark.skipif(not (Path(sys.executable).parent / "hp-recompute-plan").exists(),
                    reason="the package is not installed in this interpreter's environment")
def test_the_console_commands_are_the_tools() -> None:
    """pip's entry points exec the installed tools: same output, same exit codes."""
    tool = str(Path(sys.executable).parent / "hp-recompute-plan")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run([tool, "--schedule-gen", "zbv", "--ranks", "2"], capture_output=True, text=True,
                               env=env)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout == run_plan("--schedule-gen", "zbv", "--ranks", "2").stdout
    usage = subprocess.run([tool, "--ranks", "0", "--schedule-gen", "zbv", "--bogus"], capture_output=True,
                           text=True, env=env)
    assert usage.returncode == 2
    opt = subprocess.run([str(Path(sys.executable).parent / "hp-recompute-opt"), "--version"], capture_output=True,
                         text=True, env=env)
    assert opt.returncode == 0 and "LLVM" in opt.stdout

