"""One rank of a transformers causal LM staged by ``hp_recompute.hf.stage_module`` under
``PlannedSchedule`` (spawned by test_hf_stages.py).

Each rank builds the whole model from one seed, takes the plan's stages of its rank and
steps twice on one batch: torch's whole-batch call (``step(x, target=y)``), then
torchtitan 0.3's microbatched call (``step(arg_mbs=, kwarg_mbs=, target_mbs=)``), the
second with each layer's forwards counted. The reference is the whole model run plainly,
microbatch by microbatch, its gradients scaled as torch's schedules scale them. Writes
gradients, losses and counts to ``out/rank{R}.pt``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.nn.functional as F

import hf_models


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def main(rank: int, cfg: Dict[str, Any]) -> None:
    from torch.distributed.pipelining import PipelineStage

    from hp_recompute import hf
    from hp_recompute.pipelining import PlannedSchedule, admitted_plan

    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank, world_size=cfg["ranks"])
    torch.set_num_threads(1)
    try:
        mbs = cfg["microbatches"]
        tie = cfg.get("tie", False)
        model = hf_models.build(cfg["family"], tie=tie)
        plan = admitted_plan(cfg["plan"])
        mine = [s for s, r in enumerate(plan.stage_to_rank) if r == rank]
        modules = [hf.stage_module(model, plan, s) for s in mine]
        stages = [PipelineStage(m, s, plan.num_stages, torch.device("cpu")) for m, s in zip(modules, mine)]
        schedule = PlannedSchedule(stages, mbs, loss_fn=loss_fn, plan=cfg["plan"])
        g = torch.Generator().manual_seed(7)
        x = torch.randint(0, hf_models.VOCAB, (2 * mbs, hf_models.SEQ), generator=g)
        y = torch.randint(0, hf_models.VOCAB, (2 * mbs, hf_models.SEQ), generator=g)
        first, last = 0 in mine, plan.num_stages - 1 in mine

        def grads() -> Dict[str, torch.Tensor]:
            return {n: p.grad.clone() for m in modules for n, p in m.named_parameters() if p.grad is not None}

        losses_whole: List[torch.Tensor] = []
        schedule.step(*([x] if first else []), target=y if last else None, losses=losses_whole if last else None)
        grads_whole = grads()
        model.zero_grad(set_to_none=True)

        calls: Dict[str, int] = {}
        layer_names = [f"{m.layout.base}.{m.layout.layers}.{i}" for m in modules for i in m.layer_ids]
        for name in layer_names:
            def count(*_: Any, name: str = name) -> None:
                calls[name] = calls.get(name, 0) + 1
            model.get_submodule(f"{name}.mlp").register_forward_pre_hook(count)  # the replay calls inside
        losses_mbs: List[torch.Tensor] = []
        schedule.step(arg_mbs=[(xm,) for xm in x.chunk(mbs)] if first else None, kwarg_mbs=[{}] * mbs,
                      target_mbs=list(y.chunk(mbs)) if last else None, losses=losses_mbs if last else None,
                      return_outputs=False)
        grads_mbs = grads()

        reference = hf_models.build(cfg["family"], tie=tie)
        ref_losses = []
        for xm, ym in zip(x.chunk(mbs), y.chunk(mbs)):
            loss = loss_fn(reference(xm).logits, ym)
            (loss / mbs).backward()  # torch's schedules scale the gradients by 1 / microbatches
            ref_losses.append(loss.detach())
        names = set(n for m in modules for n, _ in m.named_parameters())
        ref_grads = {n: p.grad for n, p in reference.named_parameters(remove_duplicate=False) if n in names}
        torch.save({"grads_whole": grads_whole, "grads_mbs": grads_mbs, "ref_grads": ref_grads,
                    "losses_whole": losses_whole, "losses_mbs": losses_mbs, "ref_losses": ref_losses if last else [],
                    "calls": calls, "layers": layer_names, "params": sorted(names)},
                   os.path.join(cfg["out"], f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
