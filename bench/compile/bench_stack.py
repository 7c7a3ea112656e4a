"""torchtitan's production stack under a ZBV plan: selective checkpointing, inductor, FSDP2 and bf16 together.

Two gloo processes (pp 2 x dp 1, one thread each) train the held-out torchtitan-layout
decoder of examples/pipelining/model.py (``tok_embeddings``, blocks ``layers.N`` of causal
self-attention and MLP, ``norm`` and ``output``), split into 4 stages, under bfloat16
autocast, every block prepared in torchtitan's order: checkpoint-wrapped with the
selective policy (``selective_context_fn()``: matmul outputs saved), ``block.compile()``
(inductor), then ``fully_shard`` on a dp mesh of one rank, then the stage root. Side by
side in one run, repeated:

* torch interleaved 1F1B, compiled: torch's ``ScheduleInterleaved1F1B`` (stages in loops)
  on torch's ``checkpoint_wrapper`` with the same policy, compiled by ``block.compile()``
  (torch's checkpoint traced: the policy applied where aot_autograd partitions the graph),
  the strongest correct baseline at checkpointing memory, the ratio columns';
* torch interleaved 1F1B, eager: the same without ``compile()``;
* ours ZBV bubble, eager: ``PlannedSchedule`` with a ZBV plan replaying in bubbles, on
  ``hp_recompute.checkpoint_wrapper`` blocks: the gradients the compiled run is held to;
* ours ZBV bubble, compiled: the same blocks compiled by the wrapper's ``compile()``
  (inductor keeping the matmuls the policy saves dispatched: hpr.selective.visible-ops); the
  same under ``--memory-budget`` of interleaved 1F1B's planned activation peak, and under the
  smallest budget a ZBV plan fits;
* ours ZBV bubble, auto, compiled: the same blocks under a ZBV plan with ``--checkpoint auto``
  within interleaved 1F1B's planned activation peak of its lighter rank: the planner chooses
  per block none, selective or full (a full block's wrapper sets its selective policy aside:
  hpr.selective.plan-full), so no rank plans more activation bytes than that.

The other plans checkpoint every block selectively, on the costs ``python -m hp_recompute.costs
--module bench/compile/bench_stack.py:compiled_decoder --autocast bfloat16`` measures: the
decoder with each block compiled as the wrapper compiles it, its forwards under the run's
autocast. It is made for the layout (``dp_shard=1``), so it gathers and frees each stage and
predicts each rank's step peak (``peak_memory_bytes``), printed against the measured one. Each run: a warm-up step (metadata inference,
compilation), one step under the allocator meter (peak bytes above the step's start,
gradients zeroed before it; runner/memory.py), then ``--steps`` timed steps (median, slowest
rank, a barrier before each). Gradients are compared by relative norm per parameter
(``|g - g_ref| / |g_ref|``, the worst) with ours eager; block replays are counted in a step,
against those the plan places (one per block and microbatch it checkpoints, and one more for
a session it replays again for its dw; a block or microbatch ``--checkpoint auto`` runs
plainly replays nothing).

Usage: python bench/compile/bench_stack.py [--steps 5] [--repeats 2] [--batch 64] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from harness import example_module, machine_line, median_step_ms, spawn  # noqa: E402
DECODER = REPO / "examples" / "pipelining" / "model.py"
MICROBATCHES, STAGES, PP = 4, 4, 2
BASELINE = "torch interleaved 1F1B, compiled"
REFERENCE = "ours ZBV bubble, eager"
BUDGET = "ours ZBV bubble at i1F1B's budget, compiled"
SMALLEST = "ours ZBV bubble at its smallest budget, compiled"
AUTO = "ours ZBV bubble, auto within i1F1B's lighter rank, compiled"
PLAN_OF = {REFERENCE: "bubble", "ours ZBV bubble, compiled": "bubble", BUDGET: "budget", SMALLEST: "smallest",
           AUTO: "auto"}
VARIANTS = [BASELINE, "torch interleaved 1F1B, eager", *PLAN_OF]


def _decoder() -> Any:
    return example_module("hpr_pipelining_decoder", DECODER)


def compiled_decoder() -> torch.nn.Module:
    """The costs tool's factory: the decoder with each block compiled as the selective wrapper's
    ``compile()`` compiles it (inductor, the policy's saved ops dispatched, the backward split)."""
    sys.path.insert(0, str(REPO / "python"))
    import hp_recompute as hr

    model = _decoder().build()
    backend = hr.compile_backend("inductor", saved_ops=hr.selective.policy_saved_ops(hr.selective_context_fn()))
    for block in model.layers.values():
        block.compile(backend=backend)
    return model


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def _one(rank: int, cfg: Dict[str, Any], variant: str, mesh: Any) -> Dict[str, Any]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as torch_wrapper
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    import hp_recompute as hr
    from hp_recompute.pipelining import PlannedSchedule
    from hp_recompute.runner.memory import AllocatorPeak

    decoder = _decoder()
    torch._dynamo.reset()
    ours, compiled = variant.startswith("ours"), variant.endswith("compiled")
    mine = [rank, rank + PP] if not ours else [rank, 2 * PP - 1 - rank]  # loops, or a V
    wrap = hr.checkpoint_wrapper if ours else torch_wrapper
    stages = []
    for s in mine:
        module = decoder.stage_module(decoder.build(), cfg["split"][s])
        for key in list(module.layers.keys()):
            block = wrap(module.layers[key], context_fn=hr.selective_context_fn())
            if compiled:
                block.compile()  # torchtitan's block.compile(): inductor
            fully_shard(block, mesh=mesh["dp"])
            module.layers[key] = block
        fully_shard(module, mesh=mesh["dp"])
        stages.append(PipelineStage(module, s, STAGES, torch.device("cpu"), group=mesh.get_group("pp")))
    if ours:
        schedule = PlannedSchedule(stages, MICROBATCHES, loss_fn=_loss,
                                   plan=cfg["plans"][PLAN_OF[variant]])
    else:
        schedule = ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=_loss)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, decoder.VOCAB, (cfg["batch"], decoder.SEQ), generator=g)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)

    def step() -> None:
        for st in stages:
            st.submod.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg["autocast"]):
            schedule.step(*((tokens,) if first else ()), target=tokens.roll(-1, dims=1) if last else None)

    with AllocatorPeak():  # warm-up: metadata, compilation; profiled so that the measured step's frees are seen
        step()
    for st in stages:
        st.submod.zero_grad(set_to_none=True)
    hr.reset_stats()
    with AllocatorPeak() as meter:
        step()
    replays = hr.stats()["replays"]
    grads = {name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", ""):
             None if p.grad is None else p.grad.full_tensor().float().clone()
             for st in stages for name, p in st.submod.named_parameters()}
    ms = median_step_ms(step, cfg["steps"])
    return {"ms": ms, "peak": meter.peak, "grads": grads, "replays": replays}


def _worst_relative(grads: Dict[str, Any], reference: Dict[str, torch.Tensor]) -> float:
    """The largest ``|g - g_ref| / |g_ref|`` over the parameters (inf where a gradient is None)."""
    worst = 0.0
    for name, want in reference.items():
        got = grads.get(name)
        if got is None:
            return float("inf")
        worst = max(worst, float((got - want).norm() / want.norm().clamp_min(1e-30)))
    return worst


def body(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (PP, 1), mesh_dim_names=("pp", "dp"))
    return {"rows": [{"repeat": repeat, "variant": variant, **_one(rank, cfg, variant, mesh)}
                     for repeat in range(cfg["repeats"]) for variant in VARIANTS]}


def _plans(work: Path, batch: int, autocast: bool) -> Tuple[Dict[str, Dict[str, Any]], List[int]]:
    """The ZBV plans on the compiled decoder's measured costs (under the run's autocast), every
    block checkpointed selectively, made for the layout (``dp_shard=1``: the plan gathers and
    frees each stage and predicts each rank's step peak, ``peak_memory_bytes``): "bubble", and
    "budget" under ``--memory-budget`` of the activation peak the planner gives interleaved
    1F1B on the same costs (its bounded dw deferral runs dws earlier where they would hold
    more), "smallest" under the smallest budget it plans ZBV in (to 10 kB), "auto" with
    ``--checkpoint auto`` under interleaved 1F1B's activation peak of its lighter rank; and
    interleaved 1F1B's activation peak per rank."""
    from hp_recompute import PlanError, make_plan

    seq = _decoder().SEQ
    factory = f"{Path(__file__).resolve()}:compiled_decoder"
    subprocess.run([sys.executable, "-m", "hp_recompute.costs", "--module", factory,
                    "--input-shape", f"{batch // MICROBATCHES}x{seq}", "--input-dtype", "int64",
                    *(["--autocast", "bfloat16"] if autocast else []), "-o", str(work / "costed.json")],
                   check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")})
    graph = json.loads((work / "costed.json").read_text())
    names = [r["name"] for r in graph["regions"]]
    blocks = [i for i, name in enumerate(names) if name.startswith("layers.")]
    per = len(blocks) // STAGES
    starts = [0] + [blocks[s * per] for s in range(1, STAGES)]
    ends = [start - 1 for start in starts[1:]] + [len(names) - 1]
    spec = ",".join(f"{s}:{a}-{b}" for s, (a, b) in enumerate(zip(starts, ends)))
    common = dict(model=work / "costed.json", ranks=PP, microbatches=MICROBATCHES, stages=spec,
                  checkpoint="selective", dp_shard=1)
    i1f1b = make_plan(schedule_gen="interleaved-1f1b", **common)["summary"]["peak_bytes"]
    budget = max(i1f1b)

    def zbv(memory_budget: Optional[int] = None, checkpoint: str = "selective") -> Optional[Dict[str, Any]]:
        try:
            return make_plan(schedule_gen="zbv", prefetch="bubble", memory_budget=memory_budget,
                             **{**common, "checkpoint": checkpoint})
        except PlanError:  # no ZBV plan fits
            return None

    low, high = 0, budget
    while high - low > 10_000:
        low, high = (low, (low + high) // 2) if zbv((low + high) // 2) else ((low + high) // 2, high)
    return {"bubble": zbv(), "budget": zbv(budget), "smallest": zbv(high), "auto": zbv(min(i1f1b), "auto")}, i1f1b


def _planned_replays(plan: Dict[str, Any], rank: int) -> int:
    """The block replays ``plan`` places on ``rank``: each recompute's regions (a whole
    session's: its stage's checkpointed blocks)."""
    blocks = [sum(1 for r in stage["regions"] if r.get("checkpoint", False)) for stage in plan["model"]["stages"]]
    return sum(len(a["regions"]) if "regions" in a else blocks[a["stage"]]
               for a in plan["ranks"][rank]["actions"] if a["op"] == "recompute")


def _policies(plan: Dict[str, Any]) -> str:
    """Each block's policy in ``plan`` (none, full or selective), e.g. ``layers.0 selective``."""
    label = {False: "none", True: "full", "selective": "selective"}
    return ", ".join(f"{r['name']} {label[r.get('checkpoint', False)]}" for stage in plan["model"]["stages"]
                     for r in stage["regions"] if r["name"].startswith("layers."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="sequences per step (a multiple of 4)")
    parser.add_argument("--no-autocast", dest="autocast", action="store_false", help="float32 forwards")
    parser.add_argument("--keep", type=Path, help="a folder to keep the costs and plans in (default: removed)")
    args = parser.parse_args()
    if args.batch < MICROBATCHES or args.batch % MICROBATCHES or args.steps < 1 or args.repeats < 1:
        parser.error(f"--batch must be a positive multiple of {MICROBATCHES}, --steps and --repeats positive")
    if args.keep is not None and args.keep.exists() and not args.keep.is_dir():
        parser.error(f"--keep {args.keep}: not a folder")
    sys.path[:0] = [str(REPO / "python")]
    from hp_recompute import compile_split, selective

    if not compile_split.SUPPORTED or not selective.selective_supported():
        sys.exit(f"bench/compile/bench_stack.py needs torch >= 2.13 (the compiled dx/dw split); this is torch "
                 f"{torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        plans, i1f1b = _plans(work, args.batch, args.autocast)
        for name, plan in plans.items():
            (work / f"{name}.json").write_text(json.dumps(plan))
        split = {s: [r["name"] for r in stage["regions"]] for s, stage in enumerate(plan["model"]["stages"])}
        cfg = {"plans": {name: str(work / f"{name}.json") for name in plans}, "split": split, "steps": args.steps, "repeats": args.repeats,
               "batch": args.batch, "autocast": args.autocast}
        results = spawn(body, cfg, PP, work)
    d = _decoder()
    print(f"PP {PP} x FSDP2 1 (gloo, 2 processes, 1 thread each), {STAGES} stages, {MICROBATCHES} microbatches, the "
          f"decoder of examples/pipelining/model.py ({d.LAYERS} blocks of width {d.DIM}, vocabulary {d.VOCAB}), batch "
          f"{args.batch} x seq {d.SEQ}, {'bf16 autocast' if args.autocast else 'float32'}, every block selective (matmuls saved); step ms = median of "
          f"{args.steps} steps, slowest rank; peak = allocator bytes above the step's start (pp rank 0, 1); "
          f"the plans' step peaks (peak_memory_bytes): bubble {plans['bubble']['summary']['peak_memory_bytes']}, at "
          f"i1F1B's budget ({max(i1f1b)} activation bytes; per rank {i1f1b}) "
          f"{plans['budget']['summary']['peak_memory_bytes']}, at its smallest budget "
          f"({plans['smallest']['summary']['peak_bytes']} activation bytes) "
          f"{plans['smallest']['summary']['peak_memory_bytes']}, auto within {min(i1f1b)} "
          f"{plans['auto']['summary']['peak_memory_bytes']} (policies: {_policies(plans['auto'])})")
    print(machine_line())
    print("| run | variant | step ms | vs torch i1F1B compiled | peak bytes pp 0, 1 | peak vs torch i1F1B compiled "
          "pp 0, 1 | measured / planned peak pp 0, 1 | block replays / planned pp 0, 1 | "
          "gradients vs ours eager "
          "(worst relative norm) |")
    print("| ---: | --- | ---: | ---: | --- | --- | --- | ---: | ---: |")
    rows = results[0]["rows"]
    # each variant's gradients over both ranks (a loop places other stages on a rank than a V)
    grads = [{name: g for res in results for name, g in res["rows"][i]["grads"].items()} for i in range(len(rows))]
    for i, row in enumerate(rows):
        base = next(j for j, r in enumerate(rows) if r["repeat"] == row["repeat"] and r["variant"] == BASELINE)
        ref = next(j for j, r in enumerate(rows) if r["repeat"] == row["repeat"] and r["variant"] == REFERENCE)
        ms = max(res["rows"][i]["ms"] for res in results)
        base_ms = max(res["rows"][base]["ms"] for res in results)
        peaks = [res["rows"][i]["peak"] for res in results]
        ratios = [p / res["rows"][base]["peak"] for p, res in zip(peaks, results)]
        worst = _worst_relative(grads[i], grads[ref])
        planned = replays = "-"
        if row["variant"].startswith("ours"):
            plan = plans[PLAN_OF[row["variant"]]]
            planned = ", ".join(f"{p / q:.2f}" for p, q in zip(peaks, plan["summary"]["peak_memory_bytes"]))
            replays = ", ".join(f"{res['rows'][i]['replays']} / {_planned_replays(plan, rank)}"
                                for rank, res in enumerate(results))
        print(f"| {row['repeat'] + 1} | {row['variant']} | {ms:.1f} | {ms / base_ms:.2f} | {peaks[0]}, {peaks[1]} | "
              f"{ratios[0]:.2f}, {ratios[1]:.2f} | {planned} | {replays} | {worst:.4f} |")


if __name__ == "__main__":
    main()
