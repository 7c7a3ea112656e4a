"""Helpers for the runner tests: make plans with the real planner, run the runner.

Why not import test/python/plan/plan_cli.py: these tests only need the binary's path,
found the same way (HPR_BUILD_DIR, default <repo>/build).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import pytest
import torch

from cli_processes import run_module

REPO = Path(__file__).resolve().parents[3]
BUILD = Path(os.environ.get("HPR_BUILD_DIR", REPO / "build"))
PLAN_TOOL = BUILD / "bin" / "hp-recompute-plan"
PYTHON_DIR = REPO / "python"
GPT_MODEL_JSON = REPO / "examples" / "gpt" / "gpt.model.json"


def make_plan(tmp: Path, *args: str, name: str = "p.json") -> Path:
    """Runs hp-recompute-plan ARGS --emit json -o TMP/NAME and returns the path."""
    assert PLAN_TOOL.exists(), f"build the project first: {PLAN_TOOL} is missing"
    out = tmp / name
    proc = subprocess.run([str(PLAN_TOOL), *args, "--emit", "json", "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def pieces_plan(tmp: Path, *model: str) -> Tuple[Path, Path]:
    """A 1F1B 2 x 4 jit plan and a bubble plan that replays in pieces (hpr.exec.replay-in-pieces).
    Bubble moves only replays on a critical path (docs/planning.md); within jit's peak none of
    1F1B's has room, within twice it rank 0 prefetches microbatch 3's last blocks into the wait
    before its backward."""
    gen = [*model, *flags(("1f1b", 2, 4))]
    return (make_plan(tmp, *gen, name="jit.json"),
            make_plan(tmp, *gen, "--prefetch", "bubble", "--memory-budget", "2x", name="pieces.json"))


def run_cli(*args: str, env: Dict[str, str] | None = None, timeout: float = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs ``python3 -m hp_recompute.run ARGS`` in a process of its own (in ``cwd``, default
    this one's), started with torch imported (cli_processes.run_module)."""
    return run_module("hp_recompute.run", args, env={**os.environ, **(env or {})}, timeout=timeout, cwd=cwd)


def run_costs(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs ``python3 -m hp_recompute.costs ARGS`` as ``run_cli`` runs the runner."""
    return run_module("hp_recompute.costs", args, cwd=cwd)


def measure_costs(out: Path, model_json: Path, factory: str | None = None) -> Path:
    """``model_json`` with times and bytes measured here (``hp_recompute.costs``, 3 repeats
    after a warm-up; ``factory``: the model's ``--model``), written to ``out``."""
    proc = run_costs("--model-json", str(model_json), *(["--model", factory] if factory else []), "-o", str(out),
                     "--repeats", "3", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    return out


def run_inproc(*args: str) -> Tuple[int, Dict[str, Any]]:
    """Runs the runner's ``main`` in this process (fast); returns (exit code, report)."""
    from hp_recompute import run as runner

    threads = torch.get_num_threads()
    argv: List[str] = list(args)
    assert "--report" in argv
    try:
        code = runner.main(argv)
    finally:
        torch.set_num_threads(threads)
    report = json.loads(Path(argv[argv.index("--report") + 1]).read_text())
    return code, report


def edit_plan(src: Path, dst: Path, fn) -> Path:
    """Writes ``fn(plan_dict)`` (edited in place) to ``dst``."""
    plan = json.loads(src.read_text())
    fn(plan)
    dst.write_text(json.dumps(plan))
    return dst


def count_plan(plan_path: Path, op: str) -> int:
    plan = json.loads(plan_path.read_text())
    return sum(1 for r in plan["ranks"] for a in r["actions"] if a["op"] == op)


def model_json(tmp: Path, name: str, regions: Sequence[str], plain: Sequence[str] = (),
               file: str = "model.json") -> Path:
    """Writes the model JSON graph (docs/models.md) of a test's own model: its region names in
    order, each checkpointable one 10^6 FLOPs, those in ``plain`` not checkpointable and 10^3
    FLOPs (an embedding or a head beside the blocks). Planned with it (``--model``), a plan names
    the model's regions in the planner's partition, which is what the runner executes (it
    refuses a plan of the uniform model, made without ``--model``)."""
    graph = {"format": "hp-recompute-model", "version": 1, "name": name,
             "regions": [{"name": r, "checkpointable": r not in plain, "fwd_flops": 1000 if r in plain else 1000000,
                          "saved_bytes": 1024, "input_bytes": 256, "param_bytes": 1024} for r in regions]}
    path = tmp / file
    path.write_text(json.dumps(graph, indent=1))
    return path


def mlp_regions(layers: int) -> List[str]:
    """The regions of an MLP pipeline model with ``layers`` layers (examples/mlp/model.py:pipeline's)."""
    return ["inp", *(f"layers.{i}" for i in range(layers)), "head"]


def flags(cfg: Sequence[str]) -> List[str]:
    sched, ranks, mbs = cfg
    return ["--schedule-gen", sched, "--ranks", str(ranks), "--microbatches", str(mbs)]


def processes_with(marker: str) -> list:
    """PIDs whose environment holds ``marker`` (the run's own processes)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@contextlib.contextmanager
def reaped(marker: str) -> Iterator[None]:
    """Kills (SIGKILL) what is left of a run marked ``marker`` when the block ends: a test that
    fails by its time limit leaves no rank waiting out a long receive timeout."""
    try:
        yield
    finally:
        for pid in processes_with(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def processes_left(marker: str, within: float = 10.0) -> list:
    """``processes_with(marker)`` once none is left, or at the deadline ``within`` seconds on:
    a process that has exited may stay in /proc a moment (polled, no fixed sleep)."""
    deadline = time.monotonic() + within
    while True:
        left = processes_with(marker)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def device_node(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device of the memory driver (1:3 null, 1:7 full) in the test's folder: the
    tests never write the machine's own /dev/null or /dev/full, which a regression would replace."""
    node = tmp_path / name
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("os.mknod needs root (CAP_MKNOD)")
    return node


#: Lines that load the bundled MLP example as ``mlp_example``, whose ``pipeline(net)`` is the
#: runner's PipelineModel of a module laid out like it (``inp``, ``layers``, ``head``): for the
#: model files tests write.
MLP_EXAMPLE = (
    "import importlib.util\n"
    f"_spec = importlib.util.spec_from_file_location('mlp_example', {str(REPO / 'examples/mlp/model.py')!r})\n"
    "mlp_example = importlib.util.module_from_spec(_spec)\n"
    "_spec.loader.exec_module(mlp_example)\n")


def gpt_factory(tmp: Path, change: str, imports: str = "") -> str:
    """A ``FILE.py:build`` spec: the bundled GPT's pipeline model, with one statement ``change``
    applied to its module ``model`` (e.g. ``"model.blocks[1].compile()"``), for runner tests of
    what a model holds."""
    factory = tmp / "changed_gpt.py"
    factory.write_text(
        f"import importlib.util\n{imports}"
        f"spec = importlib.util.spec_from_file_location('gpt_example', {str(REPO / 'examples/gpt/model.py')!r})\n"
        "gpt = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(gpt)\n\n\n"
        "def build():\n"
        "    pipeline = gpt.pipeline()\n"
        "    model = pipeline.module\n"
        f"    {change}\n"
        "    return pipeline\n")
    return f"{factory}:build"
