"""Running a plan under torchrun: ``torchrun --nproc-per-node N -m hp_recompute.run --plan P``.

Why: that is how torch users launch, on one node or several (``--nnodes``,
``--rdzv-endpoint``). torchrun starts one process per rank and sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; each process joins the gloo group
with ``env://``, runs its rank's program (``multiprocess.run_rank_steps``, the same code as
the self-spawning mode) and sends its results to rank 0 (``gather_object``), which
compares them with the reference step and reports.

Initial weights: rank 0's, broadcast to every rank, so a factory that draws random
weights without a seed still gives one model. A failing rank prints its error and exits
1; torchrun then stops the other workers (its default), and a rank blocked in a receive
from the failed one gives up after ``--timeout`` at the latest.
"""

from __future__ import annotations

import argparse
import datetime
import os
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from .multiprocess import compare_steps, run_rank_steps
from .model import load_model, split_stages
from ..plan.reader import Plan, RunError

__all__ = ["torchrun_rank", "run_torchrun"]


def torchrun_rank() -> Optional[Tuple[int, int]]:
    """(rank, world size) when torchrun (or another env:// launcher) started this process."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise RunError(f"hp_recompute.run: RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
                       f"must be integers (set by torchrun)") from None


def run_torchrun(plan: Plan, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """Runs this process's rank; returns the comparison on rank 0 and None elsewhere."""
    rank, world = torchrun_rank() or (0, 1)
    if world != plan.num_ranks:
        raise RunError(f"hp_recompute.run: torchrun started {world} processes (WORLD_SIZE), but the plan has "
                       f"{plan.num_ranks} ranks ({plan.path}: /schedule/num_ranks)")
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise RunError(f"hp_recompute.run: RANK and WORLD_SIZE are set but {key} is not; launch with torchrun")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    try:
        model = load_model(args.model)
        with torch.no_grad():
            for tensor in model.module.state_dict().values():
                dist.broadcast(tensor, src=0)
        initial = {k: v.clone() for k, v in model.module.state_dict().items()} if rank == 0 else None
        cfg = {"seed": args.seed, "steps": args.steps, "timeout": args.timeout, "mode": args.checkpoint_mode}
        steps = run_rank_steps(rank, plan, model, cfg)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object({"rank": rank, "steps": steps}, gathered, dst=0)
        if rank != 0:
            return None
        results = {g["rank"]: g for g in gathered}  # type: ignore[union-attr]
        reference = load_model(args.model)  # a fresh model: adapters' units close over their module
        reference.module.load_state_dict(initial)
        specs = split_stages(plan, reference)
        compared = compare_steps(plan, reference, specs, results, args)
        compared["mode"] = f"torchrun ({world} processes)"
        return compared
    finally:
        dist.destroy_process_group()
