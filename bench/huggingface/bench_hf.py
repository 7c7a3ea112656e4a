"""A transformers Llama on 2 pipeline ranks: PlannedSchedule against torch's schedules, side by side.

The model is examples/huggingface/model.py's (8 decoder layers, hidden 128, sequence 64),
staged by ``hp_recompute.hf.stage_module`` into 4 stages as one plan splits it, microbatches
of 2 sequences. Variants, each run in the same spawned processes one after the other:

* torch interleaved 1F1B + checkpoint: torch's ``ScheduleInterleaved1F1B`` (stages in loops,
  stage s on rank s % 2) with torch's ``checkpoint_wrapper`` on every decoder layer: the
  strongest correct baseline, the ratio column's;
* torch ZBV + checkpoint: torch's ``ScheduleZBVZeroBubble`` (the V) with the same wrapper;
* PlannedSchedule, ZBV plan: hp-recompute's plan from the model's measured costs
  (``python -m hp_recompute.costs --module examples/huggingface/model.py:build_for_training``,
  then ``hp-recompute-plan --schedule-gen zbv``), every layer checkpointed by the plan;
* PlannedSchedule, ZBV at 1F1B's memory: the same, planned with ``--memory-budget`` set to the
  activation peak (``peak_bytes``) hp-recompute plans for interleaved 1F1B with every layer
  checkpointed (the baseline's), so dw deferral is bounded to it (docs/planning.md); where ZBV
  cannot fit that, the first of 1.05x, 1.1x, 1.25x, 1.5x it fits (printed below the table).

Per variant: a warm-up step (torch infers the stages' metadata; profiled, so that the
measured step's frees are seen: runner/memory.py), one step under the profiler's allocator
events (each rank's peak bytes above the step's start), the decoder-layer forwards per layer
and microbatch in that step (forwards and replays), its gradients against the whole model run
plainly microbatch by microbatch, then ``--steps`` timed steps (median; a barrier before
each). The plan's own peak per rank (``peak_memory_bytes``) is printed beside the measured.

Usage: python bench/huggingface/bench_hf.py [--steps 5] [--microbatches 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/
from harness import REPO, machine_line, median_step_ms, spawn, training_step  # noqa: E402

EXAMPLE = REPO / "examples" / "huggingface"
BASELINE = "torch interleaved 1F1B + checkpoint"
PLANNED = {"PlannedSchedule, ZBV plan": "zbv", "PlannedSchedule, ZBV at 1F1B's memory": "zbv-budget"}
VARIANTS = [BASELINE, "torch ZBV + checkpoint", *PLANNED]
RANKS, STAGES = 2, 4


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _run(rank: int, cfg: Dict[str, Any], variant: str, batch: Any, reference: Dict[str, torch.Tensor]) -> Dict:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, ScheduleZBVZeroBubble

    import model as llama
    from hp_recompute import hf
    from hp_recompute.pipelining import PlannedSchedule, admitted_plan
    from hp_recompute.runner.memory import AllocatorPeak

    plan = admitted_plan(cfg["plans"][PLANNED.get(variant, "zbv")])
    model = llama.build_for_training()
    owner = (lambda s: s % RANKS) if variant == BASELINE else (lambda s: plan.stage_to_rank[s])
    mine = [s for s in range(STAGES) if owner(s) == rank]
    modules = [hf.stage_module(model, plan, s) for s in mine]
    calls = [0]
    for module in modules:
        for key, layer in list(module.model.layers.named_children()):
            layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
            if variant not in PLANNED:
                module.model.layers.register_module(key, checkpoint_wrapper(layer))
    stages = [PipelineStage(m, s, STAGES, torch.device("cpu")) for m, s in zip(modules, mine)]
    mbs = cfg["microbatches"]
    if variant == BASELINE:
        schedule = ScheduleInterleaved1F1B(stages, mbs, loss_fn=loss_fn)
    elif variant == "torch ZBV + checkpoint":
        schedule = ScheduleZBVZeroBubble(stages, mbs, loss_fn=loss_fn)
    else:
        schedule = PlannedSchedule(stages, mbs, loss_fn=loss_fn, plan=plan)
    x, y = batch
    step = training_step(schedule, stages, x, y)
    with AllocatorPeak():
        step()
    calls[0] = 0
    with AllocatorPeak() as meter:
        step()
    layers = sum(len(m.layer_ids) for m in modules)
    worst = 0.0
    for m in modules:
        for name, p in m.named_parameters():
            want = reference[name.replace("_checkpoint_wrapped_module.", "")]
            worst = max(worst, float((p.grad - want).abs().max()) if p.grad is not None else float("inf"))
    return {"peak_bytes": meter.peak, "forwards": calls[0] / (layers * mbs), "max_grad_diff": worst,
            "step_ms": median_step_ms(step, cfg["steps"])}


def body(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    sys.path.insert(0, str(EXAMPLE))
    import model as llama

    mbs = cfg["microbatches"]
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, llama.VOCAB, (2 * mbs, llama.SEQ), generator=g)
    y = torch.roll(x, -1, dims=1)
    whole = llama.build_for_training()
    for xm, ym in zip(x.chunk(mbs), y.chunk(mbs)):
        (loss_fn(whole(xm).logits, ym) / mbs).backward()  # torch's schedules scale by 1 / microbatches
    reference = {n: p.grad for n, p in whole.named_parameters()}
    return {variant: [_run(rank, cfg, variant, (x, y), reference) for _ in range(cfg["repeats"])]
            for variant in VARIANTS}


def _plans(work: Path, microbatches: int) -> Dict[str, Dict[str, Any]]:
    """The plans, by name: ``zbv``, ``i1f1b`` (for its peak only) and ``zbv-budget``."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    costs = work / "llama.costs.json"
    subprocess.run([sys.executable, "-m", "hp_recompute.costs", "--module", f"{EXAMPLE}/model.py:build_for_training",
                    "--input-shape", "2x64", "--input-dtype", "int64", "--processes", str(RANKS), "-o", str(costs)],
                   check=True, env=env)
    tool = Path(os.environ.get("HPR_BUILD_DIR", REPO / "build")) / "bin" / "hp-recompute-plan"

    def plan(name: str, *flags: str, check: bool = True) -> Dict[str, Any]:
        out = work / f"{name}.plan.json"
        proc = subprocess.run([str(tool), "--model", str(costs), "--ranks", str(RANKS), "--microbatches",
                               str(microbatches), *flags, "--emit", "json", "-o", str(out)], check=check)
        return json.loads(out.read_text()) if proc.returncode == 0 else {}

    plans = {"zbv": plan("zbv", "--schedule-gen", "zbv"),
             "i1f1b": plan("i1f1b", "--schedule-gen", "interleaved-1f1b", "--stages-per-rank", "2")}
    peak = max(plans["i1f1b"]["summary"]["peak_bytes"])
    for factor in (1.0, 1.05, 1.1, 1.25, 1.5):  # the planner says why a budget does not fit (stderr)
        plans["zbv-budget"] = plan("zbv-budget", "--schedule-gen", "zbv", "--memory-budget",
                                   f"{int(peak * factor)}B", check=factor == 1.5)
        if plans["zbv-budget"]:
            plans["zbv-budget"]["factor"] = factor
            break
    return plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpr-bench-hf-") as folder:
        plans = _plans(Path(folder), args.microbatches)
        cfg = {"plans": plans, "steps": args.steps, "microbatches": args.microbatches, "repeats": args.repeats}
        results = spawn(body, cfg, RANKS, Path(folder))
    print(f"{machine_line()}; transformers Llama (examples/huggingface), {RANKS} gloo ranks x 1 thread, "
          f"{STAGES} stages, {args.microbatches} microbatches of 2 x 64 tokens; median of {args.steps} steps, "
          f"{args.repeats} repeats\n")
    print("| variant | step ms (per repeat) | x baseline | layer forwards / mb | peak bytes rank 0, 1 | "
          "x baseline (max rank) | max grad diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    def step_ms(variant: str) -> List[float]:  # per repeat, the slowest rank's
        return [max(rank[variant][i]["step_ms"] for rank in results) for i in range(args.repeats)]

    base_ms = min(step_ms(BASELINE))
    base_peak = max(r["peak_bytes"] for rank in results for r in rank[BASELINE])
    for variant in VARIANTS:
        runs: List[List[Dict[str, Any]]] = [rank[variant] for rank in results]
        times = step_ms(variant)
        peaks = [max(r["peak_bytes"] for r in rank) for rank in runs]
        forwards = max(r["forwards"] for rank in runs for r in rank)
        diff = max(r["max_grad_diff"] for rank in runs for r in rank)
        print(f"| {variant} | {', '.join(f'{t:.0f}' for t in times)} | {min(times) / base_ms:.2f} | "
              f"{forwards:.1f} | {', '.join(map(str, peaks))} | {max(peaks) / base_peak:.2f} | {diff:.1e} |")
    print()
    print(f"ZBV at 1F1B's memory: budget {plans['zbv-budget']['factor']}x interleaved 1F1B's planned activation peak")
    for name in ("zbv", "zbv-budget", "i1f1b"):
        summary = plans[name]["summary"]
        print(f"plan {name}: planned peaks (peak_memory_bytes) {', '.join(map(str, summary['peak_memory_bytes']))}; "
              f"activations (peak_bytes) {', '.join(map(str, summary['peak_bytes']))}; "
              f"simulated step {summary['step_time_us'] / 1e3:.1f} ms; "
              f"budget {plans[name]['planner'].get('memory_budget')}")


if __name__ == "__main__":
    main()
