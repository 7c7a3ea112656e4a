"""Multi-process runs (gloo, one process per rank): correct steps, clean failures, no hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpr_run_util import (GPT_MODEL_JSON, PYTHON_DIR, count_plan, edit_plan, flags, make_plan, processes_left, reaped,
                          run_cli)

pytestmark = pytest.mark.slow  # starts rank processes or torchrun (test/python/conftest.py)


@pytest.mark.parametrize("cfg", [("zbv", 2, 4), ("1f1b", 2, 4), ("dualpipev", 4, 8)],
                         ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}")
def test_multi_process_run(tmp_path: Path, cfg) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(cfg))
    report_path = tmp_path / "r.json"
    proc = run_cli("--plan", str(plan), "--world-size", str(cfg[1]), "--report", str(report_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["mode"] == "multi-process" and report["world_size"] == cfg[1]
    assert report["grads_match"] is True and report["max_abs_diff"] <= 1e-6
    raw = json.loads(plan.read_text())
    assert report["sessions"] == count_plan(plan, "recompute") == len(raw["sessions"])
    # Each session replays its stage's checkpointed regions once (the planner's partition).
    assert report["recomputes"] == sum(len(s["regions"]) for s in raw["sessions"]) == report["recomputes_expected"]
    assert report["sessions_left"] == 0
    assert len(report["ranks"]) == cfg[1] and all(r["measured_peak_bytes"] > 0 for r in report["ranks"])
    assert "grads_match true" in proc.stdout and proc.stdout.rstrip().endswith("ok")


@pytest.mark.parametrize("cfg,fail_at", [(("zbv", 2, 4), "1:10"), (("dualpipev", 4, 8), "2:30")],
                         ids=["zbv-2x4", "dualpipev-4x8"])
def test_planted_failure_stops_every_rank(tmp_path: Path, cfg, fail_at: str) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(cfg))
    report_path = tmp_path / "r.json"
    rank, index = fail_at.split(":")
    action = json.loads(plan.read_text())["ranks"][int(rank)]["actions"][int(index)]
    # The other ranks are stopped, not left to wait out a receive: that would take 600 s, past
    # the test's own limit (TimeoutExpired).
    marker = f"hpr-planted-{os.getpid()}"
    with reaped(marker):
        proc = run_cli("--plan", str(plan), "--world-size", str(cfg[1]), "--report", str(report_path), "--timeout",
                       "600", env={"HPR_RUN_FAIL_AT": fail_at, "HPR_TEST_RUN": marker}, timeout=240)
    assert proc.returncode == 1
    want = f"rank {rank} failed first: hp_recompute.run: rank {rank} action {index} ({action['op']} stage " \
           f"{action['stage']} mb {action['microbatch']}"
    assert want in proc.stderr
    assert f"planted failure (HPR_RUN_FAIL_AT={fail_at})" in proc.stderr
    report = json.loads(report_path.read_text())
    assert report["ok"] is False and report["failed_rank"] == int(rank) and want in report["error"]
    # Every rank ended non-zero and none kept a session.
    codes = proc.stderr.split("exit codes [")[1].split("]")[0]
    assert all(int(c) != 0 for c in codes.split(","))
    results = report["rank_results"]
    assert [r["rank"] for r in results] == list(range(cfg[1]))
    assert [r["exit_code"] for r in results] == [int(c) for c in codes.split(",")]
    assert all(r["error"] for r in results), results
    assert [r["sessions_left"] for r in results] == [0] * cfg[1]


def test_missing_send_is_refused_before_the_ranks_start(tmp_path: Path) -> None:
    """A receive whose send never comes is refused by the admission check, not waited out."""
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))

    def drop_second_send(p):
        actions = p["ranks"][0]["actions"]
        actions.pop([i for i, a in enumerate(actions) if a["op"] == "send_f"][1])

    bad = edit_plan(plan, tmp_path / "dead.json", drop_second_send)
    # Waiting for the receive would take 600 s, past the test's own limit.
    proc = run_cli("--plan", str(bad), "--world-size", "2", "--timeout", "600", "--report", str(tmp_path / "r.json"),
                   timeout=120)
    assert proc.returncode == 1
    assert "/ranks/0/actions/2: error: rank 0, action 2 (0F1): no SEND_F after it (stage 1 is on rank 1)" \
        in proc.stderr


def test_plan_from_a_pipe_runs_on_every_rank(tmp_path: Path) -> None:
    """--plan /dev/stdin: the ranks run the plan the parent read, not the (drained) pipe."""
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", 2, 4)))
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    with open(plan) as stdin:
        proc = subprocess.run([sys.executable, "-m", "hp_recompute.run", "--plan", "/dev/stdin"], stdin=stdin,
                              capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "grads_match true" in proc.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_rank_killed_mid_step_is_named_and_nothing_is_left_running(tmp_path: Path, ranks: int) -> None:
    plan = make_plan(tmp_path, "--model", str(GPT_MODEL_JSON), *flags(("zbv", ranks, 4)))
    marker = f"HPR_TEST_RUN={os.getpid()}-{ranks}"
    # The others stop within seconds (5 s grace), not after the 600 s receive timeout, which
    # would pass the test's own limit.
    with reaped(marker):
        proc = run_cli("--plan", str(plan), "--timeout", "600", env={"HPR_RUN_FAIL_AT": "1:6:kill",
                                                                       marker.split("=")[0]: marker.split("=")[1]},
                       timeout=240)
    assert proc.returncode == 1
    assert "rank 1 was killed by signal 9; it left no result" in proc.stderr, proc.stderr
    assert processes_left(marker) == [], "a rank outlived the run"
