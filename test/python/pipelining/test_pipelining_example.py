"""examples/pipelining/train.py, as docs/pipelining.md runs it: plan, then torchrun with 2 processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.pipelining", reason="needs torch.distributed.pipelining")

pytestmark = pytest.mark.slow  # starts rank processes or torchrun (test/python/conftest.py)

REPO = Path(__file__).resolve().parents[3]
PLAN_TOOL = Path(os.environ.get("HPR_BUILD_DIR", REPO / "build")) / "bin" / "hp-recompute-plan"


@pytest.mark.parametrize("emit", ["json", "torch-csv"])
def test_the_example_trains_under_torchrun(tmp_path: Path, emit: str) -> None:
    plan = tmp_path / ("plan.json" if emit == "json" else "plan.csv")
    subprocess.run([str(PLAN_TOOL), "--model", str(REPO / "examples/pipelining/decoder.model.json"),
                    "--schedule-gen", "zbv", "--ranks", "2", "--microbatches", "4", "--emit", emit, "-o", str(plan)],
                   check=True)
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(REPO / "examples/pipelining/train.py"), "--plan", str(plan), "--steps", "3"],
                          capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = re.findall(r"step (\d): loss ([0-9.]+), replays on rank 0: (\d+)", proc.stdout)
    assert [s[0] for s in steps] == ["0", "1", "2"], proc.stdout
    # One replay per checkpointed region of each of rank 0's sessions, in step 0 too (its
    # shape inference runs the regions plainly: hpr.stages.plain-inference).
    side = json.loads((plan if emit == "json" else tmp_path / "plan.hpr.json").read_text())
    want = sum(len(sess["regions"]) for sess in side["sessions"] if sess["rank"] == 0)
    assert want > 0 and [int(s[2]) for s in steps] == [want, want, want]
    assert float(steps[2][1]) < float(steps[0][1])


@pytest.mark.skipif(not __import__("hp_recompute").fsdp.FSDP_AVAILABLE, reason="needs FSDP2 (torch >= 2.6)")
@pytest.mark.parametrize("keep", [False, True], ids=["reshard_after_forward", "keep_after_forward"])
def test_the_example_trains_pp2_x_fsdp2_under_torchrun(tmp_path: Path, keep: bool) -> None:
    """docs/fsdp.md's run: 4 processes, 2 pipeline ranks x 2 FSDP2 replicas, a ZBV plan."""
    plan = tmp_path / "plan.json"
    subprocess.run([str(PLAN_TOOL), "--model", str(REPO / "examples/pipelining/decoder.model.json"),
                    "--schedule-gen", "zbv", "--ranks", "2", "--microbatches", "4", "--emit", "json", "-o", str(plan)],
                   check=True)
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                           str(REPO / "examples/pipelining/train.py"), "--plan", str(plan), "--steps", "3", "--dp",
                           "2", *(["--keep-after-forward"] if keep else [])],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = re.findall(r"step (\d): loss ([0-9.]+), replays on rank 0: (\d+)", proc.stdout)
    assert [s[0] for s in steps] == ["0", "1", "2"], proc.stdout  # printed once: pipeline rank 0, replica 0
    want = sum(len(sess["regions"]) for sess in json.loads(plan.read_text())["sessions"] if sess["rank"] == 0)
    assert want > 0 and [int(s[2]) for s in steps] == [want, want, want]
    assert float(steps[2][1]) < float(steps[0][1])


def _train(tmp_path: Path, schedule: str, nproc: int, *flags: str, policy: str = "all") -> subprocess.CompletedProcess:
    plan = tmp_path / f"{schedule}.{policy}.json"
    if not plan.exists():
        model = REPO / "examples/pipelining/decoder.model.json"
        if policy == "selective":  # the example's costs have no selective ones: made up, the run is what counts
            data = json.loads(model.read_text())
            for region in data["regions"]:
                if region["checkpointable"]:
                    region.update(selective_replay_time_us=1.0, selective_saved_bytes=region["saved_bytes"] // 2)
            model = tmp_path / "decoder.selective.model.json"
            model.write_text(json.dumps(data))
        gen = [str(PLAN_TOOL), "--model", str(model), "--checkpoint", policy, "--schedule-gen", schedule, "--ranks",
               "2", "--microbatches", "4"]
        budget = []
        if schedule == "1f1b":
            # 1F1B's critical replay moves in pieces within 1.75-2x jit's peak, selective's (half the
            # bytes) within 1.5x; with more room it moves whole (docs/planning.md).
            jit = json.loads(subprocess.run([*gen, "--emit", "json"], capture_output=True, text=True,
                                            check=True).stdout)
            room = 1.5 if policy == "selective" else 2
            budget = ["--memory-budget", str(int(room * max(jit["summary"]["peak_bytes"])))]
        subprocess.run([*gen, "--prefetch", "bubble", *budget, "--emit", "json", "-o", str(plan)], check=True)
        if schedule == "1f1b":  # these runs cover replays in pieces (hpr.exec.replay-in-pieces)
            recomputes = [a for r in json.loads(plan.read_text())["ranks"] for a in r["actions"]
                          if a["op"] == "recompute"]
            assert any("regions" in a and not a.get("in_backward") for a in recomputes), recomputes
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), str(REPO / "examples/pipelining/train.py"), "--plan", str(plan), "--steps", "3",
                           *flags], capture_output=True, text=True, env=env, timeout=400)


@pytest.mark.skipif(not __import__("hp_recompute").compile_split.SUPPORTED,
                    reason="the compiled dx/dw split needs torch >= 2.13")
@pytest.mark.parametrize("schedule", ["zbv", "1f1b"])
def test_the_example_trains_compiled_fsdp2_blocks_to_the_eager_losses_under_torchrun(tmp_path: Path,
                                                                                     schedule: str) -> None:
    """torchtitan's order with ``--compile`` on 2 pipeline ranks x 2 FSDP2 replicas: checkpoint-wrap,
    ``block.compile()``, ``fully_shard``, then the stage; the same losses as the eager blocks, one
    replay per block per microbatch."""
    runs = {}
    for name, flags in (("eager", []), ("compiled", ["--compile", "aot_eager"])):
        proc = _train(tmp_path, schedule, 4, "--dp", "2", *flags)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[name] = re.findall(r"step (\d): loss ([0-9.]+), replays on rank \d: (\d+)", proc.stdout)
    assert len(runs["eager"]) == 3 and runs["compiled"] == runs["eager"], runs


@pytest.mark.skipif(not __import__("hp_recompute").compile_split.SUPPORTED,
                    reason="the compiled dx/dw split needs torch >= 2.13")
def test_the_example_trains_compiled_and_selective_blocks_to_the_eager_full_plans_losses_under_torchrun(
        tmp_path: Path) -> None:
    """torchtitan's order on a ZBV plan, with and without ``--compile`` and the plan's selective policy
    (checkpoint-wrap with ``selective_context_fn()``, ``block.compile()``, the stage): all four
    runs train to the losses of the eager blocks checkpointed in full, one replay per block per
    microbatch. One test, so that each launch runs once."""
    runs = {}
    for backend in (None, "aot_eager"):
        for policy in ("all", "selective"):
            proc = _train(tmp_path, "zbv", 2, "--dp", "1", *(["--compile", backend] if backend else []),
                          policy=policy)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            runs[backend or "eager", policy] = re.findall(r"step (\d): loss ([0-9.]+), replays on rank \d: (\d+)",
                                                          proc.stdout)
    reference = runs["eager", "all"]
    assert len(reference) == 3 and all(run == reference for run in runs.values()), runs


@pytest.mark.skipif(not __import__("hp_recompute").compile_split.SUPPORTED or
                    not __import__("hp_recompute").fsdp.FSDP_AVAILABLE,
                    reason="needs the compiled dx/dw split (torch >= 2.13) and FSDP2")
def test_the_example_trains_a_selective_plan_to_the_full_plans_losses_under_torchrun(tmp_path: Path) -> None:
    """torchtitan's whole order with the plan's selective policy on 2 pipeline ranks x 2 FSDP2
    replicas: checkpoint-wrap with ``selective_context_fn()``, ``block.compile()`` with inductor,
    ``fully_shard``, the stage, under torchrun: the losses of the plan that checkpoints in full, one
    replay per block per microbatch (the matmuls the policy saves stay dispatched,
    hpr.selective.visible-ops)."""
    runs = {}
    for policy in ("all", "selective"):
        proc = _train(tmp_path, "zbv", 4, "--dp", "2", "--compile", "inductor", policy=policy)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[policy] = re.findall(r"step (\d): loss ([0-9.]+), replays on rank \d: (\d+)", proc.stdout)
    assert len(runs["all"]) == 3 and runs["selective"] == runs["all"], runs
