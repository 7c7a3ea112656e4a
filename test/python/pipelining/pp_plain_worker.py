"""One rank of PlannedSchedule-versus-the-plain-model checks (spawned by test_planned_schedule.py).

What a plan must keep of the model it runs, each case against the model run plainly (no
pipeline, no checkpoint) on the same microbatches:

* ``keywords``: blocks called with keywords named like checkpoint options (``debug=``,
  ``early_stop=``, ``use_reentrant=``): they reach the blocks;
* ``buffers``: blocks updating buffers in forward (a call counter, BatchNorm statistics),
  two steps: each updated once per microbatch, not again by replays or metadata inference;
* ``two_plans``: two schedules over the same stages (checkpoint-all, then nothing
  checkpointed), stepped A, B, A: each step replays what its own plan says;
* ``frozen``: the first stage's parameters frozen, under ZBV and ZB-H1, and the first two
  stages' under ZBV: every other weight gets its gradient.

Writes each case's losses, gradients, buffers and replay counts to ``out/rank{R}.pt``.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
from pp_worker import stage_module


class Block(nn.Module):
    """A residual MLP that reads the checkpoint-named keywords and may update buffers."""

    def __init__(self, dim: int, buffers: bool) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.norm = nn.BatchNorm1d(dim) if buffers else None
        if buffers:
            self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor, debug: bool = False, early_stop: bool = False,
                use_reentrant: bool = False) -> torch.Tensor:
        if self.norm is not None:
            with torch.no_grad():
                self.calls += 1
            x = self.norm(x)
        y = x + self.fc2(torch.tanh(self.fc1(x)))
        return y + 0.25 * debug - 0.125 * early_stop + 0.5 * use_reentrant


class Net(nn.Module):
    def __init__(self, dim: int, n: int, buffers: bool, keywords: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): Block(dim, buffers) for i in range(n)})
        self.head = nn.Linear(dim, dim)
        self.keywords = keywords

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        options = {"debug": True, "early_stop": True, "use_reentrant": True} if self.keywords else {}
        for layer in self.layers.values():
            x = layer(x, **options)
        return self.head(x) if self.head is not None else x


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def plain(full: Net, x: torch.Tensor, y: torch.Tensor, microbatches: int, steps: int) -> Dict[str, Any]:
    """The model without pipeline or checkpoint, ``steps`` times: losses, gradients of the last
    step (averaged over microbatches, as torch's schedules scale them) and buffers."""
    model = copy.deepcopy(full)
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        losses = []
        for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
            loss = loss_fn(model(xm), ym)
            (loss / microbatches).backward()
            losses.append(loss.detach())
    return {"losses": losses, "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
            "buffers": {n: b.clone() for n, b in model.named_buffers()}}


def planned(rank: int, cfg: Dict[str, Any], full: Net, plans: List[str], x: torch.Tensor, y: torch.Tensor,
            frozen: List[str] = (), steps: int = 1) -> Dict[str, Any]:
    """PlannedSchedules of ``plans`` (in order) over one set of this rank's stages, stepped in
    turn ``steps`` times: losses, gradients and buffers of the last step, replays of each step."""
    from torch.distributed.pipelining import PipelineStage

    from hp_recompute import reset_stats, stats
    from hp_recompute.pipelining import PlannedSchedule
    from hp_recompute.plan.verify import load_plan

    plan = load_plan(plans[0])
    stages = []
    for s, owner in enumerate(plan.stage_to_rank):
        if owner == rank:
            module = stage_module(full, [r["name"] for r in plan.stages[s]])
            for name, p in module.named_parameters():
                p.requires_grad_(name not in frozen)
            stages.append(PipelineStage(module, s, plan.num_stages, torch.device("cpu")))
    schedules = [PlannedSchedule(stages, cfg["microbatches"], loss_fn=loss_fn, plan=p) for p in plans]
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    replays, losses = [], []
    for step in range(steps):
        schedule = schedules[step % len(schedules)]
        for st in stages:
            st.submod.zero_grad(set_to_none=True)
        losses = []
        reset_stats()
        schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses if last else None)
        replays.append(stats()["replays"])
    params = {n: p for st in stages for n, p in st.submod.named_parameters()}
    return {"losses": [l.detach() for l in losses], "replays": replays,
            "grads": {n: p.grad for n, p in params.items() if p.requires_grad},
            "buffers": {n: b.clone() for st in stages for n, b in st.submod.named_buffers()}}


def main(rank: int, cfg: Dict[str, Any]) -> None:
    sys.path.insert(0, cfg["python"])
    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(7)
        x = torch.randn(cfg["batch"], cfg["dim"], generator=g)
        y = torch.randn(cfg["batch"], cfg["dim"], generator=g)
        mb, plans, out = cfg["microbatches"], cfg["plans"], {}

        def net(buffers: bool = False, keywords: bool = False) -> Net:
            torch.manual_seed(0)
            return Net(cfg["dim"], cfg["layers"], buffers, keywords)

        full = net(keywords=True)
        out["keywords"] = {"plain": plain(full, x, y, mb, 1), "plan": planned(rank, cfg, full, [plans["zbv"]], x, y)}
        full = net(buffers=True)
        out["buffers"] = {"plain": plain(full, x, y, mb, 2),
                          "plan": planned(rank, cfg, full, [plans["zbv"]], x, y, steps=2)}
        full = net()
        out["two_plans"] = {"plain": plain(full, x, y, mb, 1),
                            "plan": planned(rank, cfg, full, [plans["zbv"], plans["zbv_none"]], x, y, steps=3)}
        from hp_recompute.plan.verify import load_plan

        # the first stage frozen (its regions' parameters); under ZBV also the first two, so that stage 2
        # hands stage 1, on its rank, no input gradient (hpr.stages.step-buffers)
        for kind, case, count in (("zbv", "zbv", 1), ("zb-h1", "zb-h1", 1), ("zbv", "two_zbv", 2)):
            first = tuple(r["name"] + "." for s in range(count) for r in load_plan(plans[kind]).stages[s])
            frozen = [n for n, _ in full.named_parameters() if n.startswith(first)]
            reference = copy.deepcopy(full)
            for name, p in reference.named_parameters():
                p.requires_grad_(name not in frozen)
            out[f"frozen_{case}"] = {"plain": plain(reference, x, y, mb, 1),
                                     "plan": planned(rank, cfg, full, [plans[kind]], x, y, frozen=frozen)}
        torch.save(out, os.path.join(cfg["out"], f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
