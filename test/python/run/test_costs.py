"""``python -m hp_recompute.costs``: measured times reach the plan; bad input is refused."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hpr_run_util import (GPT_MODEL_JSON, PYTHON_DIR, device_node, flags, make_plan, pieces_plan, run_cli,
                          run_costs)
from hp_recompute.selective import selective_supported

TIMES = ("fwd_time_us", "bwd_input_time_us", "bwd_weight_time_us")


def test_measured_times_are_written_and_planned_with(tmp_path: Path) -> None:
    out = tmp_path / "gpt.costed.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "-o", str(out), "--repeats", "3", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    graph = json.loads(out.read_text())
    for region in graph["regions"]:
        assert all(region[k] > 0 for k in TIMES), region
    plan = json.loads(make_plan(tmp_path, "--model", str(out), *flags(("zb-h1", 2, 4))).read_text())
    planned = {r["name"]: r for s in plan["model"]["stages"] for r in s["regions"]}
    for region in graph["regions"]:
        assert planned[region["name"]]["bwd_input_time_us"] == region["bwd_input_time_us"]
        assert planned[region["name"]]["bwd_weight_time_us"] == region["bwd_weight_time_us"]
        for key in ("checkpoint_state_bytes", "replay_bytes"):
            assert planned[region["name"]].get(key) == region.get(key)
            assert (region.get(key, 0) > 0) == region["checkpointable"], region
    # The simulated step is at least the critical path of one microbatch: every forward and dx.
    one_microbatch = sum(r["fwd_time_us"] + r["bwd_input_time_us"] for r in graph["regions"])
    assert plan["summary"]["step_time_us"] >= one_microbatch


def test_from_run_scales_the_fields_the_planner_sums() -> None:
    """``--from-run`` has no rule of its own: it asks the planner's (``regionTimeOf``) which
    region field each action adds, the first stage's I adding none and its W being its B."""
    sys.path.insert(0, str(PYTHON_DIR))
    from hp_recompute.plan.verify import planner_extension

    field = planner_extension().region_time_field
    assert field("forward", 1, True, "full") == "checkpoint_fwd_time_us"
    assert field("forward", 1, False, "full") == "fwd_time_us"  # a no_checkpoint forward
    assert field("forward", 1, True, "selective") == "selective_fwd_time_us"
    assert field("forward", 1, True, "none") == "fwd_time_us"
    assert field("recompute", 1, True, "full") == "replay_time_us"
    assert field("recompute", 1, True, "selective") == "selective_replay_time_us"
    assert field("recompute", 1, True, "none") is None
    assert field("backward_input", 1, True, "none") == "bwd_input_time_us"
    assert field("backward_input", 1, True, "selective") == "bwd_input_time_us"
    assert field("backward_input", 0, True, "none") is None
    assert field("backward_weight", 1, True, "none") == "bwd_weight_time_us"
    assert field("backward_weight", 0, True, "none") == "bwd_time_us"
    assert field("backward", 0, True, "full") == "bwd_time_us"
    assert field("clear", 1, True, "full") is None
    with pytest.raises(ValueError, match="region_checkpoint: expected none, full or selective, got 'True'"):
        field("forward", 1, True, "True")


@pytest.mark.parametrize("policy", ["all", pytest.param("selective", marks=pytest.mark.skipif(
    not selective_supported(), reason="selective checkpointing needs torch >= 2.4"))])
def test_costs_from_a_run_price_every_action_as_long_as_it_ran(tmp_path: Path, policy: str) -> None:
    """Planned again with ``--from-run`` costs, each rank's simulated busy time is the sum of
    the durations its actions had in the run: the Python mapping of actions to region fields
    agrees with the planner's cost model (CostModel.cpp), checked through the planner; for
    the selective policy too (its own forward and replay fields)."""
    costed = tmp_path / "costed.json"
    assert run_costs("--model-json", str(GPT_MODEL_JSON), "-o", str(costed), "--repeats", "3",
                  "--warmup", "1").returncode == 0
    cfg = ("zb-h1", 2, 4)  # forward, recompute, I and W on both stages
    plan = make_plan(tmp_path, "--model", str(costed), "--checkpoint", policy, *flags(cfg))
    report_path = tmp_path / "report.json"
    steps = 3
    proc = run_cli("--plan", str(plan), "--world-size", "2", "--steps", str(steps), "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    from_run = tmp_path / "from-run.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report_path), "-o", str(from_run))
    assert proc.returncode == 0, proc.stderr
    # The run's stage split: a split balanced again by the new times could move a region.
    spans, first = [], 0
    for st in json.loads(plan.read_text())["model"]["stages"]:
        spans.append(f"{st['stage']}:{first}-{first + len(st['regions']) - 1}")
        first += len(st["regions"])
    replanned = json.loads(make_plan(tmp_path, "--model", str(from_run), "--checkpoint", policy, "--stages",
                                     ",".join(spans), *flags(cfg), name="again.json").read_text())
    timed = steps - len(report["profiled_steps"])
    for rank in report["ranks"]:
        # The planner prices a clear and the first stage's I at 0 (nothing to compute).
        ran = sum(m["median_us"] * m["count"] / timed for m in rank["measured_action_us"]
                  if m["op"] != "clear" and not (m["op"] == "backward_input" and m["stage"] == 0))
        planned = replanned["summary"]["busy_us"][rank["rank"]]
        assert abs(planned - ran) <= 1e-3 * ran, (rank["rank"], planned, ran)
        assert planned != json.loads(plan.read_text())["summary"]["busy_us"][rank["rank"]]


def test_a_run_plan_with_an_unknown_policy_is_located(tmp_path: Path) -> None:
    """``--from-run`` reads the run's plan without admitting it: a policy it does not know is
    an error naming the plan and the region, not a region priced as not checkpointed."""
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"model": {"stages": [{"stage": 0, "regions": [
        {"name": "blocks.0", "checkpoint": "Selective"}]}]}}))
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"plan": str(plan), "ranks": [{"measured_action_us": []}]}))
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    assert (f"hp_recompute.costs: {plan}: /model/stages: region 'blocks.0': checkpoint: expected false, true or "
            f"\"selective\", got 'Selective'") in proc.stderr
    assert not out.exists() and "Traceback" not in proc.stderr


@pytest.mark.parametrize("report,where", [
    ({"ranks": [{"rank": 0}]},
     "/ranks: expected measured_action_us per rank (a multi-process report of python -m hp_recompute.run)"),
    ({"plan": "p.json", "ranks": [{"measured_action_us": [{"op": "forward"}]}]},
     "/ranks/0/measured_action_us/0: expected an object with op, stage, plain and median_us"),
], ids=["no-action-times", "malformed-action-time"])
def test_a_bad_run_report_is_located(tmp_path: Path, report: dict, where: str) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(path), "-o", str(out))
    assert proc.returncode == 1
    assert f"hp_recompute.costs: {path}: {where}" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_a_run_of_a_plan_with_pieces_is_refused(tmp_path: Path) -> None:
    """A piece times part of a replay, and the backward after it the rest: neither is a time
    the planner prices, so ``--from-run`` refuses such a run rather than scale by it."""
    _, plan = pieces_plan(tmp_path, "--model", str(GPT_MODEL_JSON))
    actions = json.loads(plan.read_text())["ranks"][0]["actions"]
    first = next(i for i, a in enumerate(actions) if a["op"] == "recompute" and "regions" in a)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"plan": str(plan), "ranks": [{"measured_action_us": []}]}))
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    assert proc.returncode == 1
    assert (f"hp_recompute.costs: {plan}: /ranks/0/actions/{first}: the run replayed a session in pieces (a "
            f"recompute with regions), whose times are parts of a replay; take --from-run from a run of a plan "
            f"without pieces (hp-recompute-plan without --prefetch bubble)") in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_a_plan_priced_without_measured_costs_is_refused(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("1f1b", 2, 2)))
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"plan": str(plan), "ranks": [{"measured_action_us": []}]}))
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    assert proc.returncode == 1
    assert (f"hp_recompute.costs: {plan}: region 'tok_emb' has no fwd_time_us: plan with costs measured by "
            f"python -m hp_recompute.costs before taking them from a run") in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_region_names_that_are_not_the_models_are_refused(tmp_path: Path) -> None:
    graph = json.loads(GPT_MODEL_JSON.read_text())
    graph["regions"][2]["name"] = "blocks.x"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(graph))
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(bad), "-o", str(out), "--repeats", "2", "--warmup", "1")
    assert proc.returncode == 1
    assert f"hp_recompute.costs: {bad}: /regions: names [tok_emb, blocks.0, blocks.x" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_an_unwritable_output_is_refused_before_measuring(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "-o", str(out), "--repeats", "2", "--warmup", "1")
    assert proc.returncode == 1
    assert f"hp_recompute.costs: -o {out}: no directory {out.parent}" in proc.stderr
    assert "Traceback" not in proc.stderr


FAILING_MODEL = '''
import torch
from hp_recompute.runner import PipelineModel, Region

def build():
    lin = torch.nn.Linear(4, 4)
    def broken(x, b):
        raise ValueError("region l1 cannot run")
    regions = [Region("l0", lambda x, b: lin(x), ["weight", "bias"]), Region("l1", broken, [])]
    return PipelineModel("broken", lin, regions, lambda g: torch.randn(2, 4, generator=g), lambda b: lin(b).sum())
'''


def test_a_failing_model_is_reported_in_every_process_mode(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(FAILING_MODEL)
    graph = {"name": "broken", "regions": [{"name": "l0"}, {"name": "l1"}]}
    (tmp_path / "m.json").write_text(json.dumps(graph))
    for processes in ("1", "2"):
        proc = run_costs("--model-json", str(tmp_path / "m.json"), "--model", f"{tmp_path}/broken.py:build",
                      "-o", str(tmp_path / "out.json"), "--repeats", "2", "--warmup", "1", "--processes", processes)
        assert proc.returncode == 1, proc.stderr
        assert "ValueError: region l1 cannot run" in proc.stderr
        assert "Traceback" not in proc.stderr and not (tmp_path / "out.json").exists()


# -- hostile input: every case is located, exits 1 (2 for usage) and writes nothing ----------


def _refused(proc: subprocess.CompletedProcess, code: int, message: str, out: Path) -> None:
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_a_report_that_is_not_utf8_is_located(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_bytes(b'{"plan": "p.json",\n "ranks": "\xff"}')
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    _refused(proc, 1, f"hp_recompute: {report}:2:12: invalid UTF-8 (byte 0xff); expected UTF-8 text", out)


def test_a_deeply_nested_report_is_located(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text('{"ranks":\n' + "[" * 100_000 + "]" * 100_000 + "}")
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    _refused(proc, 1, f"hp_recompute: {report}:2:100: JSON nested deeper than 100 levels", out)


def _priced_plan_and_report(tmp_path: Path, median_us) -> Path:
    """A plan of the GPT priced at 0.1 us per field, and a run report of it with one measured
    forward of stage 0 (``median_us``), as ``--from-run`` reads them."""
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("1f1b", 2, 2)))
    raw = json.loads(plan.read_text())
    for stage in raw["model"]["stages"]:
        for region in stage["regions"]:
            region.update({k: 0.1 for k in TIMES + ("bwd_time_us", "checkpoint_fwd_time_us", "replay_time_us")})
    plan.write_text(json.dumps(raw))
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"plan": str(plan), "ranks": [{"measured_action_us": [
        {"op": "forward", "stage": 0, "plain": False, "median_us": median_us, "count": 1}]}]}))
    return report


def test_a_time_that_overflows_to_infinity_is_not_written(tmp_path: Path) -> None:
    """1e308 us spread over regions priced 0.1 us overflows: the planner would refuse the file."""
    report = _priced_plan_and_report(tmp_path, 1e308)
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    _refused(proc, 1, f"hp_recompute.costs: -o {out}: not written: /regions/0/fwd_time_us (region 'tok_emb') is "
                      f"inf; the planner reads only finite numbers (check the times in {report})", out)


def test_a_nan_in_the_report_is_located(tmp_path: Path) -> None:
    report = _priced_plan_and_report(tmp_path, float("nan"))
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    _refused(proc, 1, f"hp_recompute.costs: {report}: /ranks/0/measured_action_us/0: expected an object with op, "
                      f"stage, plain and median_us (a finite number >= 0)", out)


def test_a_time_of_zero_prints_no_ratio(tmp_path: Path) -> None:
    report = _priced_plan_and_report(tmp_path, 0)
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["regions"][0]["fwd_time_us"] == 0
    assert any(line.startswith("tok_emb") and line.split()[5:7] == ["-", "-"] for line in proc.stdout.splitlines())


@pytest.mark.parametrize("onto", ["report", "plan", "model-json"])
def test_an_output_onto_an_input_is_refused(tmp_path: Path, onto: str) -> None:
    report = _priced_plan_and_report(tmp_path, 10.0)
    plan = Path(json.loads(report.read_text())["plan"])
    model_json = tmp_path / "m.json"
    model_json.write_text(GPT_MODEL_JSON.read_text())
    out = {"report": report, "plan": plan, "model-json": model_json}[onto]
    before = out.read_bytes()
    proc = run_costs("--model-json", str(model_json), "--from-run", str(report), "-o", str(out))
    assert proc.returncode == 2, proc.stderr
    flag = {"report": f"--from-run {report}", "plan": f"--from-run's /plan {plan}",
            "model-json": f"--model-json {model_json}"}[onto]
    assert f"hp_recompute.costs: -o {out} is the same file as the input {flag}" in proc.stderr
    assert out.read_bytes() == before


@pytest.mark.parametrize("flag,value,message", [
    ("--processes", "100000", "--processes must be in [1, 64], got 100000"),
    ("--repeats", str(10**20), f"--repeats must be in [1, 10000], got {10**20}"),
    ("--threads", "100000", "--threads must be in [1, 1024], got 100000"),
    ("--seed", str(10**23), f"--seed must be in [0, 2^63), got {10**23}"),
    ("--from-run", "", "--from-run: an empty value"),
])
def test_numeric_flags_out_of_range_are_usage_errors(tmp_path: Path, flag: str, value: str, message: str) -> None:
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "-o", str(out), flag, value)
    _refused(proc, 2, message, out)


def test_an_output_onto_a_character_device_keeps_the_device(tmp_path: Path) -> None:
    report = _priced_plan_and_report(tmp_path, 10.0)
    null = device_node(tmp_path, "null", 3)
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(null))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(null.stat().st_mode)


def test_a_model_that_exits_while_measured_is_a_failure(tmp_path: Path) -> None:
    (tmp_path / "exits.py").write_text(FAILING_MODEL.replace('raise ValueError("region l1 cannot run")',
                                                             'raise SystemExit(0)'))
    graph = {"name": "broken", "regions": [{"name": "l0"}, {"name": "l1"}]}
    (tmp_path / "m.json").write_text(json.dumps(graph))
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(tmp_path / "m.json"), "--model", f"{tmp_path}/exits.py:build", "-o", str(out),
                  "--repeats", "2", "--warmup", "1")
    _refused(proc, 1, f"hp_recompute.costs: measuring model 'broken' failed: SystemExit: 0 (at {tmp_path}/exits.py:",
             out)


def test_a_backward_timed_with_its_replay_scales_both(tmp_path: Path) -> None:
    """A run times a backward whose session replays inside it (``in_backward``) as one
    ``backward+recompute``: --from-run spreads that time over both actions' region fields, so
    the replay is neither priced 0 nor folded into the backward."""
    report = _priced_plan_and_report(tmp_path, 1.0)
    raw = json.loads(report.read_text())
    plan = json.loads(Path(raw["plan"]).read_text())
    assert any(a.get("in_backward") for rank in plan["ranks"] for a in rank["actions"] if a["op"] == "recompute")
    raw["ranks"][0]["measured_action_us"] = [
        {"op": "backward+recompute", "stage": 1, "plain": False, "median_us": 30.0, "count": 1}]
    report.write_text(json.dumps(raw))
    out = tmp_path / "out.json"
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--from-run", str(report), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    names = {r["name"] for r in plan["model"]["stages"][1]["regions"]}
    checkpointed = {r["name"] for r in plan["model"]["stages"][1]["regions"] if r.get("checkpoint") in (True, "full")}
    regions = {r["name"]: r for r in json.loads(out.read_text())["regions"] if r["name"] in names}
    assert checkpointed and len(regions) == len(names)
    total = sum(r["bwd_time_us"] for r in regions.values()) + sum(regions[n]["replay_time_us"] for n in checkpointed)
    assert total == pytest.approx(30.0, abs=0.01)  # the times are written to 3 decimals
    for name in checkpointed:  # both fields scaled by the one ratio
        assert regions[name]["replay_time_us"] == pytest.approx(regions[name]["bwd_time_us"], abs=0.002) != 0.1
