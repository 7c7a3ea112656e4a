"""What the multi-process benches share: ranks spawned on gloo, timed steps, the machine line.

A bench script defines ``body(rank, cfg) -> dict`` at its top level (spawned processes
import the script again to find it) and calls ``spawn(body, cfg, ranks, work)``: each rank
runs ``body`` in a gloo process group of ``ranks`` processes, one thread each, and the
parent gets every rank's dict back, or exits naming the first rank that raised, with its
traceback. ``median_step_ms`` times steps as every bench does: a barrier before each (the
ranks start together), the median of ``steps``.

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/
    from harness import example_module, machine_line, median_step_ms, spawn, training_step
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]

Body = Callable[[int, Dict[str, Any]], Dict[str, Any]]


def _rank_main(rank: int, body: Body, cfg: Dict[str, Any]) -> None:
    sys.path[:0] = [str(REPO / "python")]
    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank, world_size=cfg["world_size"])
    torch.set_num_threads(1)
    out: Dict[str, Any] = {}
    try:
        out["result"] = body(rank, cfg)
    except BaseException:  # noqa: BLE001 -- reported by the parent, which names the rank
        out["exception"] = traceback.format_exc()
    torch.save(out, os.path.join(cfg["out"], f"rank{rank}.pt"))
    dist.destroy_process_group()


def example_module(name: str, path: Path) -> Any:
    """The example file ``path`` (e.g. examples/pipelining/model.py), imported once under
    ``name``: its own name (``model``, ``train``) is too common to import plainly."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def spawn(body: Body, cfg: Dict[str, Any], ranks: int, work: Path) -> List[Dict[str, Any]]:
    """Runs ``body(rank, cfg)`` on ``ranks`` spawned gloo processes (their store and results
    under ``work``); returns each rank's dict, in rank order."""
    import torch.multiprocessing as mp

    out = work / "out"
    out.mkdir()
    cfg = {**cfg, "store": str(work / "store"), "out": str(out), "world_size": ranks}
    mp.start_processes(_rank_main, args=(body, cfg), nprocs=ranks, start_method="spawn", join=True)
    results = [torch.load(out / f"rank{r}.pt") for r in range(ranks)]
    for rank, res in enumerate(results):
        if "exception" in res:
            sys.exit(f"rank {rank} failed:\n{res['exception']}")
    return [res["result"] for res in results]


def training_step(schedule: Any, stages: List[Any], inputs: torch.Tensor, target: torch.Tensor) -> Callable[[], None]:
    """One step of ``schedule`` over this rank's ``stages`` from zeroed gradients: the first
    stage takes ``inputs``, the last ``target`` (a rank may hold both, or neither)."""
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)

    def step() -> None:
        for st in stages:
            st.submod.zero_grad(set_to_none=True)
        schedule.step(*((inputs,) if first else ()), target=target if last else None)

    return step


def median_step_ms(step: Callable[[], None], steps: int) -> float:
    """The median wall time of ``steps`` calls of ``step``, in ms, each after a barrier."""
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def machine_line() -> str:
    """Host, cores, torch and date: the line every bench table starts with."""
    return f"{platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, {datetime.date.today().isoformat()}"
