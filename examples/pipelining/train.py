"""Train the example decoder with torch.distributed.pipelining stages driven by an hp-recompute plan.

    hp-recompute-plan --model examples/pipelining/decoder.model.json --schedule-gen zbv \\
        --ranks 2 --microbatches 4 --emit json -o /tmp/plan.json
    torchrun --nproc-per-node 2 examples/pipelining/train.py --plan /tmp/plan.json

Each rank builds the whole model from one seed, keeps the stages the plan puts on it
(torchtitan's way: delete what the stage does not own, FQNs stay the full model's), wraps
them in torch's ``PipelineStage`` and hands them to ``PlannedSchedule``, which runs the
plan's actions: torch's F / I / W / B and transfers, plus the plan's recompute and clear.
Use ``ScheduleZBVZeroBubble`` (and ``torch.utils.checkpoint`` on each layer) in its place
for torch's own behaviour. docs/pipelining.md walks through it.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as decoder  # noqa: E402

from hp_recompute import reset_stats, stats  # noqa: E402
from hp_recompute.pipelining import PlannedSchedule  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True, help="plan JSON, or a torch CSV from --emit torch-csv")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env:// from torchrun
    rank = dist.get_rank()
    plan_json = args.plan if args.plan.endswith(".json") else os.path.splitext(args.plan)[0] + ".hpr.json"
    with open(plan_json) as f:
        plan = json.load(f)
    stage_to_rank = plan["schedule"]["stage_to_rank"]
    num_mb = plan["schedule"]["num_microbatches"]

    stages = []
    for s in [s for s, r in enumerate(stage_to_rank) if r == rank]:
        regions = [region["name"] for region in plan["model"]["stages"][s]["regions"]]
        module = decoder.stage_module(decoder.build(), regions)
        stages.append(PipelineStage(module, s, len(stage_to_rank), torch.device("cpu")))

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    schedule = PlannedSchedule(stages, num_mb, loss_fn=loss_fn, plan=args.plan)
    params = [p for stage in stages for p in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=args.lr)
    first = any(stage.is_first for stage in stages)
    last = any(stage.is_last for stage in stages)
    data = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        tokens = torch.randint(0, decoder.VOCAB, (decoder.BATCH, decoder.SEQ), generator=data)
        target = tokens.roll(-1, dims=1)  # the next token
        losses = []
        reset_stats()
        schedule.step(*((tokens,) if first else ()), target=target if last else None, losses=losses if last else None)
        optimizer.step()
        optimizer.zero_grad()
        if last:
            # Step 0 also runs torch's shape inference, plainly: it replays nothing (schedule.py Rule 6).
            print(f"step {step}: loss {torch.stack(losses).mean().item():.4f}, replays on rank {rank}: "
                  f"{stats()['replays']}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
