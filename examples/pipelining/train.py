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

With ``--dp N`` the ranks form a (pipeline, data) mesh: ``N`` data-parallel replicas of
the pipeline, each block sharded over them with FSDP2 in torchtitan's order (the blocks
the plan checkpoints wrapped with ``hp_recompute.checkpoint_wrapper``, then
``fully_shard`` per block, then the stage), each replica on its own batch.
docs/fsdp.md walks through it:

    torchrun --nproc-per-node 4 examples/pipelining/train.py --plan /tmp/plan.json --dp 2

With ``--compile inductor`` (or ``aot_eager``) each block is compiled in torchtitan's
order, after checkpoint-wrapping and before ``fully_shard``: a wrapped block's
``compile()`` compiles it inside the checkpoint with a backend whose backward splits into
the plan's I and W (docs/compile-split.md). Under a plan that checkpoints selectively
(``--checkpoint selective``, on a model with selective costs) inductor keeps the matmuls the
policy saves dispatched, so the replay reads them back (hpr.selective.visible-ops).
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

from hp_recompute import checkpoint_wrapper, compile_backend, reset_stats, selective_context_fn, stats  # noqa: E402
from hp_recompute.pipelining import PlannedSchedule  # noqa: E402


def prepare(module: torch.nn.Module, regions: list, mesh, reshard_after_forward: bool, backend) -> None:
    """torchtitan's order: checkpoint-wrap what the plan checkpoints (with the selective policy's
    ``context_fn`` where the plan says ``"selective"``), compile each block, ``fully_shard``
    each block, then the stage.

    The wrapper must come before ``fully_shard``: it replays its block with the block's
    parameters unsharded, where a checkpoint around an FSDP module would not (docs/fsdp.md).
    A wrapper's ``compile()`` compiles its block inside the checkpoint, with the backward
    split; a block the plan does not checkpoint gets the split backend directly.
    """
    if mesh is not None:
        from torch.distributed.fsdp import fully_shard
    policy = {r["name"]: r.get("checkpoint") for r in regions}
    for name in list(module.layers.keys()):
        block = module.layers[name]
        if policy.get(f"layers.{name}"):  # true (full) or "selective": the policy's context_fn
            selective = {"context_fn": selective_context_fn()} if policy[f"layers.{name}"] == "selective" else {}
            block = checkpoint_wrapper(block, **selective)
            if backend:
                block.compile(backend=backend)
        elif backend:
            block.compile(backend=compile_backend(backend))
        module.layers[name] = block
        if mesh is not None:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    if mesh is not None:
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True, help="plan JSON, or a torch CSV from --emit torch-csv")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dp", type=int, default=1, help="FSDP2 data-parallel degree (ranks = pipeline x dp)")
    parser.add_argument("--keep-after-forward", action="store_true",
                        help="fully_shard(reshard_after_forward=False): no all-gather in the backward or a replay")
    parser.add_argument("--compile", choices=["inductor", "aot_eager"], default=None,
                        help="compile each block (torch >= 2.13), torchtitan's order")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env:// from torchrun
    pp_group, dp_mesh, dp_rank = None, None, 0
    if args.dp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dist.get_world_size() // args.dp, args.dp), mesh_dim_names=("pp", "dp"))
        pp_group, dp_mesh, dp_rank = mesh.get_group("pp"), mesh["dp"], mesh.get_local_rank("dp")
    rank = dist.get_rank(pp_group)  # this rank in the pipeline
    plan_json = args.plan if args.plan.endswith(".json") else os.path.splitext(args.plan)[0] + ".hpr.json"
    with open(plan_json) as f:
        plan = json.load(f)
    stage_to_rank = plan["schedule"]["stage_to_rank"]
    num_mb = plan["schedule"]["num_microbatches"]

    stages = []
    for s in [s for s, r in enumerate(stage_to_rank) if r == rank]:
        regions = [region["name"] for region in plan["model"]["stages"][s]["regions"]]
        module = decoder.stage_module(decoder.build(), regions)
        prepare(module, plan["model"]["stages"][s]["regions"], dp_mesh, not args.keep_after_forward, args.compile)
        stages.append(PipelineStage(module, s, len(stage_to_rank), torch.device("cpu"), group=pp_group))

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    schedule = PlannedSchedule(stages, num_mb, loss_fn=loss_fn, plan=args.plan)
    params = [p for stage in stages for p in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=args.lr)
    first = any(stage.is_first for stage in stages)
    last = any(stage.is_last for stage in stages)
    data = torch.Generator().manual_seed(dp_rank)  # each replica its own batch
    for step in range(args.steps):
        tokens = torch.randint(0, decoder.VOCAB, (decoder.BATCH, decoder.SEQ), generator=data)
        target = tokens.roll(-1, dims=1)  # the next token
        losses = []
        reset_stats()
        schedule.step(*((tokens,) if first else ()), target=target if last else None, losses=losses if last else None)
        optimizer.step()
        optimizer.zero_grad()
        if last and dp_rank == 0:
            # Step 0 also runs torch's shape inference, plainly: it replays nothing (hpr.stages.plain-inference).
            print(f"step {step}: loss {torch.stack(losses).mean().item():.4f}, replays on rank {rank}: "
                  f"{stats()['replays']}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
