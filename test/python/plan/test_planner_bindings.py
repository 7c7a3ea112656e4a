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
import warnings
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


@pytest.mark.parametrize("schedule_gen", ["zbv", "1f1b"])
def test_make_plan_warns_what_the_cli_warns(schedule_gen: str, tmp_path: Path) -> None:
    """A budget that bounds dx/dw pairs on a model that does not say what a dx keeps for its dw
    earns a warning (hpr.split.weight-input-unknown): make_plan gives each line the CLI prints
    as a PlanWarning, and the same plan; a 1F1B schedule splits no backward and earns none."""
    model = json.loads(Path(GPT).read_text())
    for region in model["regions"]:
        region.pop("bwd_weight_input_bytes", None)
    unknown = tmp_path / "unknown.model.json"
    unknown.write_text(json.dumps(model))
    kwargs = dict(schedule_gen=schedule_gen, ranks=2, microbatches=4, model=str(unknown), checkpoint="auto",
                  memory_budget="1.5x", prefetch="bubble")
    flags = ["--schedule-gen", schedule_gen, "--ranks", "2", "--microbatches", "4", "--model", str(unknown),
             "--checkpoint", "auto", "--memory-budget", "1.5x", "--prefetch", "bubble"]
    with warnings.catch_warnings(record=True) as said:  # every warning, to compare them with the CLI's
        warnings.simplefilter("always")
        plan = hr.make_plan(**kwargs)
    proc = run_plan(*flags, "--emit", "json")
    assert plan == json.loads(proc.stdout)
    prefix = "hp-recompute-plan: warning: "
    cli = [line[len(prefix):] for line in proc.stderr.splitlines() if line.startswith(prefix)]
    assert [(w.category, str(w.message)) for w in said] == [
        (hr.PlanWarning, f"hp_recompute.make_plan: {line}") for line in cli]
    assert bool(cli) == (schedule_gen == "zbv")
    if cli:
        assert cli[0].endswith("[hpr.split.weight-input-unknown]"), cli


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
    """hpr.exec.forward-only: with the first reshard of rank 0 moved to the front, its stage's actions
    read parameters that are sharded; the admission check every runtime uses says so."""
    plan = hr.make_plan(schedule_gen="zbv", ranks=2, microbatches=4, model=GPT, dp_shard=2)
    actions = plan["ranks"][0]["actions"]
    first = next(i for i, a in enumerate(actions) if a["op"] == "reshard")
    actions.insert(0, actions.pop(first))
    problems = _refused_alike(plan, tmp_path / "p.json")
    assert any("whose parameters are not unsharded here [hpr.verify.gathered]" in p for p in problems)


@pytest.mark.parametrize("kwargs,line", [
    (dict(schedule_gen="zbv", schedule="x.csv"), "usage: schedule= and schedule_gen= are exclusive"),
    (dict(), "usage: give one schedule: a file (schedule=) or a generator (schedule_gen=)"),
    (dict(schedule_gen="zbv", model=GPT, checkpoint="some"),
     "usage: checkpoint: expected all, model, none, auto or selective, got 'some'"),
    (dict(schedule_gen="zbv", model=GPT, checkpoint="auto"), "usage: checkpoint='auto' needs memory_budget="),
    (dict(schedule_gen="zbv", prefetch="soon"), "usage: prefetch: expected jit, lookahead=K or bubble, got 'soon'"),
    (dict(schedule_gen="zbv", memory_budget=-1), "usage: memory_budget: expected bytes such as 24GiB, or a "
     "multiple of the checkpoint-all peak such as 1.5x, got '-1'"),
    (dict(schedule_gen="zbv", memory_budget="0x"), "usage: memory_budget: expected bytes such as 24GiB, or a "
     "multiple of the checkpoint-all peak such as 1.5x, got '0x'"),
    (dict(schedule_gen="zbv", memory_budget=True), "usage: memory_budget: expected bytes (an int) or a str such as "
     "'24GiB' or '1.5x', got True"),
    (dict(schedule_gen="zbv", memory_budget=1.5), "usage: memory_budget: expected bytes (an int) or a str such as "
     "'24GiB' or '1.5x', got 1.5"),
    (dict(schedule_gen="zbv", dp_shard=0), "usage: dp_shard: expected an integer between 1 and 1048576, got 0"),
    (dict(schedule_gen="zbv", dp_replicate=2.0), "usage: dp_replicate: expected a count (an int), got 2.0"),
    (dict(schedule_gen="zbv", model="gpt.pt"), "usage: gpt.pt: a TorchScript model is read by the CLI only"),
    (dict(schedule_gen="nosuch"), "nosuch: unknown schedule: expected one of gpipe"),
    (dict(schedule="/nonexistent/s.csv"), "/nonexistent/s.csv: cannot read schedule file"),
    (dict(schedule_gen="zbv", ranks=2, microbatches=4, model=GPT, memory_budget=1000),
     "hpr-bound-weight-deferral: no dw placement fits budget 1000 bytes: rank 0 holds"),
])
def test_a_refused_request_names_what_is_wrong(kwargs: dict, line: str) -> None:
    with pytest.raises(hr.PlanError) as info:
        hr.make_plan(**kwargs)
    assert any(line in problem for problem in info.value.problems), info.value.problems


ZBV_CSV = str(REPO / "test" / "inputs" / "schedules" / "pytorch-zbv-5x11.csv")
UNIFORM = "(with a schedule alone, every stage is one unit-cost checkpointed region)"

# One case per request make_plan took and the CLI refused (issue #54, item 7): (make_plan's
# arguments, its one line, the CLI's arguments, the line it prints before exiting 2). The rules
# are PlanRequest::validate's, shared; each side spells the options as its caller writes them.
DISAGREEMENTS = {
    "stages without a model": (
        dict(schedule_gen="zbv", stages="0:0-3"), f"stages= shapes a model; give one with model= {UNIFORM}",
        ["--schedule-gen", "zbv", "--stages", "0:0-3"], f"--stages shapes a model; give one with --model {UNIFORM}"),
    "checkpoint model without a model": (
        dict(schedule_gen="zbv", checkpoint="model"), f"checkpoint= shapes a model; give one with model= {UNIFORM}",
        ["--schedule-gen", "zbv", "--checkpoint", "model"],
        f"--checkpoint shapes a model; give one with --model {UNIFORM}"),
    "checkpoint selective without a model": (
        dict(schedule_gen="1f1b", checkpoint="selective"),
        f"checkpoint= shapes a model; give one with model= {UNIFORM}",
        ["--schedule-gen", "1f1b", "--checkpoint", "selective"],
        f"--checkpoint shapes a model; give one with --model {UNIFORM}"),
    "ranks with a schedule file": (
        dict(schedule=ZBV_CSV, ranks=4), f"ranks= sizes a generated schedule; schedule='{ZBV_CSV}' has its own",
        ["--schedule", ZBV_CSV, "--ranks", "4"],
        f"--ranks sizes a generated schedule; --schedule {ZBV_CSV} has its own"),
    "microbatches with a schedule file": (
        dict(schedule=ZBV_CSV, microbatches=8),
        f"microbatches= sizes a generated schedule; schedule='{ZBV_CSV}' has its own",
        ["--schedule", ZBV_CSV, "--microbatches", "8"],
        f"--microbatches sizes a generated schedule; --schedule {ZBV_CSV} has its own"),
    "stages per rank with a schedule file": (
        dict(schedule=ZBV_CSV, stages_per_rank=2),
        f"stages_per_rank= sizes a generated schedule; schedule='{ZBV_CSV}' has its own",
        ["--schedule", ZBV_CSV, "--stages-per-rank", "2"],
        f"--stages-per-rank sizes a generated schedule; --schedule {ZBV_CSV} has its own"),
    "a schedule file and a generator": (
        dict(schedule=ZBV_CSV, schedule_gen="zbv"), "schedule= and schedule_gen= are exclusive",
        ["--schedule", ZBV_CSV, "--schedule-gen", "zbv"], "--schedule and --schedule-gen are exclusive"),
    "ranks beyond an int": (
        dict(schedule_gen="zbv", ranks=2**40), "ranks: expected at most 2147483647, got 1099511627776",
        ["--schedule-gen", "zbv", "--ranks", str(2**40)], "--ranks: expected at most 2147483647, got 1099511627776"),
    "no ranks": (
        dict(schedule_gen="zbv", ranks=0), "ranks: expected 1 or more, got 0",
        ["--schedule-gen", "zbv", "--ranks", "0"], "--ranks: expected 1 or more, got 0"),
    "negative microbatches": (
        dict(schedule_gen="zbv", microbatches=-3), "microbatches: expected 1 or more, got -3",
        ["--schedule-gen", "zbv", "--microbatches", "-3"], "--microbatches: expected 1 or more, got -3"),
    "no stages per rank": (
        dict(schedule_gen="zbv", stages_per_rank=0),
        "stages_per_rank: expected 1 or more (leave it out for the schedule's default), got 0",
        ["--schedule-gen", "zbv", "--stages-per-rank", "0"],
        "--stages-per-rank: expected 1 or more (leave it out for the schedule's default), got 0"),
}


@pytest.mark.parametrize("case", sorted(DISAGREEMENTS))
def test_make_plan_refuses_what_the_cli_refuses(case: str) -> None:
    kwargs, line, flags, cli_line = DISAGREEMENTS[case]
    with pytest.raises(hr.PlanError) as info:
        hr.make_plan(**kwargs)
    assert info.value.problems == ["usage: " + line]
    proc = run_plan(*flags, check=False)
    assert (proc.returncode, proc.stderr) == (2, f"hp-recompute-plan: error: {cli_line}\n")


@pytest.mark.parametrize("name,value,line", [
    ("ranks", True, "ranks: expected a count (an int), got True"),
    ("microbatches", 4.0, "microbatches: expected a count (an int), got 4.0"),
    ("stages_per_rank", "2", "stages_per_rank: expected a count (an int), got '2'"),
    ("ranks", 2**70, "ranks: expected a count (an int), got 1180591620717411303424, beyond 64 bits"),
    ("model", GPT.encode(), f"model: expected a file name (a str or os.PathLike), got {GPT.encode()!r}"),
    ("model", "", "model: expected a file name (a str or os.PathLike), got ''"),
    ("schedule_gen", b"zbv", "schedule_gen: expected a non-empty str, got b'zbv'"),
    ("checkpoint", 1, "checkpoint: expected a non-empty str, got 1"),
    ("prefetch", "", "prefetch: expected a non-empty str, got ''"),
    ("stages", ["0:0-3"], "stages: expected a non-empty str, got ['0:0-3']"),
])
def test_make_plan_refuses_an_argument_of_the_wrong_type_as_usage(name: str, value: object, line: str) -> None:
    """Not taken as something else (True as 1 rank) nor left to the extension's TypeError."""
    kwargs = dict(schedule_gen="zbv", model=GPT)
    kwargs[name] = value
    with pytest.raises(hr.PlanError) as info:
        hr.make_plan(**kwargs)
    assert info.value.problems == ["usage: " + line]


def test_a_schedule_file_given_as_a_path_plans_as_its_name() -> None:
    assert hr.make_plan(schedule=Path(ZBV_CSV)) == plan_json("--schedule", ZBV_CSV)


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

