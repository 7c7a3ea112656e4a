"""Train a transformers Llama with torch pipeline stages driven by an hp-recompute plan.

    python -m hp_recompute.costs --module examples/huggingface/model.py:build_for_training \\
        --input-shape 2x64 --input-dtype int64 --processes 2 -o /tmp/llama.costs.json
    hp-recompute-plan --model /tmp/llama.costs.json --schedule-gen zbv --ranks 2 \\
        --microbatches 4 --emit json -o /tmp/llama.plan.json
    torchrun --nproc-per-node 2 examples/huggingface/train.py --plan /tmp/llama.plan.json

Each rank builds the whole model, takes the stages the plan puts on it
(``hp_recompute.hf.stage_module``: the full model's names, input ids in and logits out,
rotary embeddings and causal mask on every stage) and runs them under ``PlannedSchedule``.
``--schedule torch-zbv`` runs torch's ``ScheduleZBVZeroBubble`` on the same stages with
torch's ``checkpoint_wrapper`` on every layer instead, for comparison. Each step prints the
loss, the layer forwards per microbatch (forward and replays) and the step time.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as llama  # noqa: E402

from hp_recompute import hf  # noqa: E402
from hp_recompute.pipelining import PlannedSchedule, admitted_plan  # noqa: E402


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--schedule", choices=["planned", "torch-zbv"], default="planned")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    plan = admitted_plan(args.plan)
    model = llama.build_for_training()
    mine = [s for s, r in enumerate(plan.stage_to_rank) if r == rank]
    modules = [hf.stage_module(model, plan, s) for s in mine]
    calls = [0]
    for module in modules:
        for layer in module.model.layers:
            layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    if args.schedule == "torch-zbv":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        for module in modules:
            for key, layer in list(module.model.layers.named_children()):
                module.model.layers.register_module(key, checkpoint_wrapper(layer))
    stages = [PipelineStage(m, s, plan.num_stages, torch.device("cpu")) for m, s in zip(modules, mine)]
    if args.schedule == "planned":
        schedule = PlannedSchedule(stages, plan.num_microbatches, loss_fn=loss_fn, plan=plan)
    else:
        schedule = ScheduleZBVZeroBubble(stages, plan.num_microbatches, loss_fn=loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    first, last = 0 in mine, plan.num_stages - 1 in mine
    layers = sum(len(m.layer_ids) for m in modules)
    for step in range(args.steps):
        tokens = torch.randint(0, llama.VOCAB, (2 * plan.num_microbatches, llama.SEQ), generator=gen)
        target = torch.roll(tokens, -1, dims=1)
        losses = []
        calls[0] = 0
        start = time.perf_counter()
        schedule.step(*([tokens] if first else []), target=target if last else None, losses=losses if last else None)
        seconds = time.perf_counter() - start
        optimizer.step()
        optimizer.zero_grad()
        if last:
            per_layer = calls[0] / (layers * plan.num_microbatches)
            print(f"step {step}: loss {torch.stack(losses).mean().item():.4f}, rank {rank} layer forwards per "
                  f"microbatch {per_layer:.1f}, step {seconds * 1e3:.0f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
