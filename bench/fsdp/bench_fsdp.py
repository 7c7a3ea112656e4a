"""PP 2 x FSDP2 on gloo: step time, collectives and peak memory of torch's schedules against PlannedSchedule.

Four processes form a (pp 2, dp 2) mesh and train the model of the PlannedSchedule tests
(test/python/pipelining/pp_worker.py: residual MLP blocks ``layers.N`` and a head), split
into 4 stages in a V, wrapped as torchtitan does (checkpoint-wrap each block, then
``fully_shard`` each block and the stage). Per ``reshard_after_forward`` setting, side by
side in one run and repeated:

* none: PlannedSchedule with a ZBV plan that checkpoints nothing;
* torch interleaved 1F1B + checkpoint: torch's ``ScheduleInterleaved1F1B`` (stages in loops)
  with torch's ``checkpoint_wrapper``: the strongest correct baseline, the ratio column's;
* torch ZBV + checkpoint: torch's ``ScheduleZBVZeroBubble`` with torch's ``checkpoint_wrapper``;
* ours jit / ours bubble: PlannedSchedule with ``hp_recompute.checkpoint_wrapper`` blocks
  and a ZBV plan that checkpoints every block, replays placed just in time or in bubbles;
* ours bubble, planned layout: the same, planned on the model's measured costs
  (``python -m hp_recompute.costs --module bench/fsdp/net.py:build``) with
  ``dp_shard=2``, so the plan unshards and reshards each stage and predicts each rank's
  peak with the gathered parameters (``peak_memory_bytes``), printed beside the measured.

Each run: a warm-up step (torch infers stage metadata), one step under the profiler's
allocator events (peak bytes above the step's start, per rank; the collectives FSDP
issues in it counted at ``torch.distributed``, summed over the ranks), then ``--steps``
timed steps (median; a barrier before each). The gradients of the measured step are
compared with the unsharded model's (mean over the dp ranks).

Usage: python bench/fsdp/bench_fsdp.py [--steps 5] [--repeats 2] [--dim 256] [--layers 8] [--batch 256]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from harness import machine_line, median_step_ms, spawn, training_step  # noqa: E402
TESTS = REPO / "test" / "python" / "pipelining"
MICROBATCHES, STAGES, PP, DP = 4, 4, 2, 2
BASELINE = "torch interleaved 1F1B + checkpoint"
VARIANTS = ["none", BASELINE, "torch ZBV + checkpoint", "ours jit", "ours bubble", "ours bubble, planned layout"]
PLANS = {"none": "none", "ours jit": "jit", "ours bubble": "bubble", "ours bubble, planned layout": "layout"}


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _batch(cfg: Dict[str, Any], dp_rank: int) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(7 + dp_rank)
    return [torch.randn(cfg["batch"], cfg["dim"], generator=g) for _ in range(2)]


def _one(rank: int, cfg: Dict[str, Any], variant: str, reshard: bool, mesh: Any, ref: Dict[str, Any]) -> Dict[str, Any]:
    from pp_worker import CALLS, Net, counted_collectives, stage_module, stage_split, stages_of_rank
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as torch_wrapper
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, ScheduleZBVZeroBubble

    import hp_recompute as hr
    from hp_recompute.pipelining import PlannedSchedule
    from hp_recompute.runner.memory import AllocatorPeak

    dp_mesh, pp_rank = mesh["dp"], mesh.get_local_rank("pp")
    torch.manual_seed(0)
    full = Net(cfg["dim"], cfg["layers"], 0.0)
    split = stage_split({"layers": cfg["layers"], "stages": STAGES})
    wrap = {"none": None, "torch ZBV + checkpoint": torch_wrapper, BASELINE: torch_wrapper}.get(
        variant, hr.checkpoint_wrapper)
    placement = "i1f1b" if variant == BASELINE else "zbv"
    stages = []
    for s in stages_of_rank({"ranks": PP, "stages": STAGES, "torch_schedule": placement}, pp_rank):
        module = stage_module(full, split[s])
        for key in list(module.layers.keys()):
            if wrap is not None:
                module.layers[key] = wrap(module.layers[key])
            fully_shard(module.layers[key], mesh=dp_mesh, reshard_after_forward=reshard)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard)
        stages.append(PipelineStage(module, s, STAGES, torch.device("cpu"), group=mesh.get_group("pp")))
    if variant == "torch ZBV + checkpoint":
        schedule = ScheduleZBVZeroBubble(stages, MICROBATCHES, loss_fn=_loss)
    elif variant == BASELINE:
        schedule = ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=_loss)
    else:
        plan = cfg["plans"][PLANS[variant]]
        schedule = PlannedSchedule(stages, MICROBATCHES, loss_fn=_loss, plan=plan)
    x, y = _batch(cfg, mesh.get_local_rank("dp"))
    step = training_step(schedule, stages, x, y)

    step()  # warm-up: torch infers the stages' metadata
    CALLS.clear()
    with AllocatorPeak() as meter, counted_collectives() as collectives:
        step()
    calls = max(CALLS.values()) / MICROBATCHES if CALLS else 0.0
    grads_ok = True
    for st in stages:
        for name, p in st.submod.named_parameters():
            want = ref[name.replace("_checkpoint_wrapped_module.", "")]
            if p.grad is None or not torch.allclose(p.grad.full_tensor(), want, rtol=1e-5, atol=1e-6):
                grads_ok = False
    ms = median_step_ms(step, cfg["steps"])
    return {"ms": ms, "peak": meter.peak, "calls": calls, "grads_ok": grads_ok, "collectives": dict(collectives)}


def body(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    sys.path[:0] = [str(TESTS)]
    from pp_worker import Net
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
    torch.manual_seed(0)
    reference = copy.deepcopy(Net(cfg["dim"], cfg["layers"], 0.0))
    for d in range(DP):
        xd, yd = _batch(cfg, d)
        (_loss(reference(xd), yd) / DP).backward()
    ref = {n: p.grad for n, p in reference.named_parameters()}
    rows = []
    for repeat in range(cfg["repeats"]):
        for reshard in (True, False):
            for variant in VARIANTS:
                row = _one(rank, cfg, variant, reshard, mesh, ref)
                rows.append({"repeat": repeat, "reshard": reshard, "variant": variant, **row})
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256, help="samples per dp rank and step")
    args = parser.parse_args()
    sys.path[:0] = [str(REPO / "python"), str(TESTS)]
    from hp_recompute import make_plan
    from test_planned_schedule import model_json

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_json(work / "model.json", args.layers)
        subprocess.run([sys.executable, "-m", "hp_recompute.costs", "--module", f"{HERE / 'net.py'}:build",
                        "--input-shape", f"{args.batch // MICROBATCHES}x{args.dim}", "-o", str(work / "costed.json")],
                       check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "HPR_BENCH_NET": f"{args.dim},{args.layers}"})
        per = args.layers // STAGES
        spec = ",".join(f"{s}:{s * per}-{(s + 1) * per - 1 + (s == STAGES - 1)}" for s in range(STAGES))
        plans, layout_peaks = {}, []
        for name, options in {"none": {"checkpoint": "none"}, "jit": {}, "bubble": {"prefetch": "bubble"},
                              "layout": {"prefetch": "bubble", "dp_shard": DP}}.items():
            model = work / ("costed.json" if name == "layout" else "model.json")
            plan = make_plan(schedule_gen="zbv", model=model, ranks=PP, microbatches=MICROBATCHES, stages=spec,
                             **options)
            if name == "layout":
                layout_peaks = plan["summary"]["peak_memory_bytes"]
            path = work / f"{name}.json"
            path.write_text(json.dumps(plan))
            plans[name] = str(path)
        cfg = {"plans": plans, "steps": args.steps, "repeats": args.repeats, "dim": args.dim,
               "layers": args.layers, "batch": args.batch}
        results = spawn(body, cfg, PP * DP, work)
    print(f"PP {PP} x FSDP2 {DP} (gloo, 4 processes, 1 thread each), ZBV, {STAGES} stages, {MICROBATCHES} "
          f"microbatches, {args.layers} blocks of width {args.dim}, batch {args.batch} per dp rank; "
          f"step ms = median of {args.steps} steps, slowest rank; all-gathers and reduce-scatters in one step, "
          f"all ranks; peak = allocator bytes above the step's start (pp rank 0, 1; dp rank 0)")
    print(machine_line())
    print("| reshard_after_forward | run | variant | step ms | vs torch interleaved 1F1B | all-gathers | "
          "reduce-scatters | block calls / microbatch | peak bytes pp 0, 1 | measured / planned peak pp 0, 1 | "
          "gradients = unsharded |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |")
    rows = results[0]["rows"]
    for i, row in enumerate(rows):
        ms = max(res["rows"][i]["ms"] for res in results)
        base = next(r for r in rows if r["repeat"] == row["repeat"] and r["reshard"] == row["reshard"]
                    and r["variant"] == BASELINE)
        base_ms = max(res["rows"][rows.index(base)]["ms"] for res in results)
        gathers, scatters = (sum(res["rows"][i]["collectives"].get(kind, 0) for res in results)
                             for kind in ("all_gather", "reduce_scatter"))
        measured = [results[0]["rows"][i]["peak"], results[DP]["rows"][i]["peak"]]  # pp ranks 0 and 1, dp 0
        peaks = f"{measured[0]}, {measured[1]}"
        ratio = (", ".join(f"{m / p:.2f}" for m, p in zip(measured, layout_peaks))
                 if PLANS.get(row["variant"]) == "layout" else "-")
        ok = all(res["rows"][i]["grads_ok"] for res in results)
        calls = max(res["rows"][i]["calls"] for res in results)
        print(f"| {row['reshard']} | {row['repeat'] + 1} | {row['variant']} | {ms:.1f} | {ms / base_ms:.2f} | "
              f"{gathers} | {scatters} | {calls:g} | {peaks} | {ratio} | {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main()
