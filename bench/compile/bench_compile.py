"""Eager against compiled blocks under PlannedSchedule, with torch's compiled 1F1B as the reference point.

Two gloo processes train the Llama-style example (``examples/llama/model.py``: RMSNorm,
rotary embeddings, grouped-query SDPA, SwiGLU; ``layers`` a ModuleDict), torchtitan's
stage layout (a copy of the model per stage, the parts it does not own set to None or
deleted), every block checkpointed. Side by side in one run, repeated:

* torch 1F1B + checkpoint, eager / compiled: torch's ``Schedule1F1B`` on 2 stages (one
  per rank), each block in torch's ``checkpoint_wrapper``; compiled as torchtitan does,
  ``torch.compile(wrapper, fullgraph=True)`` registered in the block's place (torch's
  zero-bubble schedules refuse compiled stages);
* torch ZBV + checkpoint, eager: torch's ``ScheduleZBVZeroBubble`` on 4 stages in a V;
* ours ZBV, eager / compiled: ``PlannedSchedule`` with a ZBV plan replaying in bubbles
  (``make_plan``), each block in ``hp_recompute.checkpoint_wrapper``; compiled by the
  wrapper's ``compile(fullgraph=True)``, torchtitan's ``block.compile()``.

The compiled variants use ``--backend`` (inductor by default). Each run: a first step
(torch's metadata inference and, compiled, the compilation: reported apart as "first step
s"), then ``--steps`` timed steps (median, slowest rank, a barrier before each). The
measured step's gradients are compared with the eager variant of the same schedule.

Usage: python bench/compile/bench_compile.py [--steps 5] [--repeats 2] [--dim 256] [--layers 8] [--backend inductor]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from harness import machine_line, median_step_ms, spawn, training_step  # noqa: E402
TESTS = REPO / "test" / "python" / "pipelining"
RANKS, MICROBATCHES = 2, 4
# variant -> (schedule, stages, compiled)
VARIANTS = {
    "torch 1F1B + checkpoint, eager": ("1f1b", 2, False),
    "torch 1F1B + checkpoint, compiled": ("1f1b", 2, True),
    "torch ZBV + checkpoint, eager": ("zbv", 4, False),
    "ours ZBV bubble, eager": ("ours", 4, False),
    "ours ZBV bubble, compiled": ("ours", 4, True),
}


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _one(rank: int, cfg: Dict[str, Any], variant: str, llama: Any, full: Any) -> Dict[str, Any]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as torch_wrapper
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleZBVZeroBubble

    import hp_recompute as hr
    from hp_recompute.pipelining import PlannedSchedule

    kind, stages_n, compiled = VARIANTS[variant]
    mine = [rank] if stages_n == RANKS else [rank, 2 * RANKS - 1 - rank]
    torch._dynamo.reset()
    stages = []
    for s in mine:
        module = llama.stage_module(full, s, stages_n)
        for key in list(module.layers.keys()):
            if kind == "ours":
                block = hr.checkpoint_wrapper(module.layers[key])
                if compiled:
                    block.compile(backend=cfg["backend"], fullgraph=True)  # torchtitan's block.compile()
            else:
                block = torch_wrapper(module.layers[key])
                if compiled:
                    block = torch.compile(block, backend=cfg["backend"], fullgraph=True)
            module.layers[key] = block
        stages.append(PipelineStage(module, s, stages_n, torch.device("cpu")))
    if kind == "1f1b":
        schedule = Schedule1F1B(stages[0], MICROBATCHES, loss_fn=_loss)
    elif kind == "zbv":
        schedule = ScheduleZBVZeroBubble(stages, MICROBATCHES, loss_fn=_loss)
    else:
        schedule = PlannedSchedule(stages, MICROBATCHES, loss_fn=_loss, plan=cfg["plan"])
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g)
    target = tokens.roll(-1, dims=1)
    step = training_step(schedule, stages, tokens, target)

    dist.barrier()
    start = time.perf_counter()
    step()  # metadata inference and, compiled, the compilation
    first_s = time.perf_counter() - start
    step()
    grads = {name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", ""): p.grad.clone()
             for st in stages for name, p in st.submod.named_parameters()}
    hr.reset_stats()
    ms = median_step_ms(step, cfg["steps"])
    return {"ms": ms, "first_s": first_s, "grads": grads, "replays": hr.stats()["replays"] / cfg["steps"]}


def body(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    from hp_recompute.factory import import_file

    llama = import_file(str(REPO / "examples" / "llama" / "model.py"), "bench/compile", RuntimeError)
    torch.manual_seed(0)
    full = llama.Transformer(llama.ModelArgs(dim=cfg["dim"], n_layers=cfg["layers"], n_heads=8, n_kv_heads=4,
                                             vocab_size=cfg["vocab"], max_seq_len=cfg["seq"]))
    rows = []
    for repeat in range(cfg["repeats"]):
        eager: Dict[str, Dict[str, torch.Tensor]] = {}
        for variant, (kind, _, compiled) in VARIANTS.items():
            row = _one(rank, cfg, variant, llama, full)
            grads = row.pop("grads")
            if not compiled:
                eager[kind] = grads
                same = None
            else:
                same = all(torch.allclose(grads[n], eager[kind][n], rtol=1e-3, atol=1e-5) for n in grads)
            rows.append({"repeat": repeat, "variant": variant, "same": same, **row})
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8, help="a multiple of 4")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager"])
    args = parser.parse_args()
    sys.path[:0] = [str(REPO / "python"), str(TESTS), str(TESTS.parent)]  # test_planned_schedule, rank_processes
    from hp_recompute import compile_split, make_plan
    from test_planned_schedule import model_json

    if not compile_split.SUPPORTED:
        sys.exit(f"bench/compile needs torch >= 2.13 (the compiled dx/dw split); this is torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_json(work / "model.json", args.layers)
        per = args.layers // 4
        spec = ",".join(f"{s}:{s * per}-{(s + 1) * per - 1 + (s == 3)}" for s in range(4))
        plan = make_plan(schedule_gen="zbv", model=work / "model.json", ranks=RANKS, microbatches=MICROBATCHES,
                         stages=spec, prefetch="bubble")
        (work / "plan.json").write_text(json.dumps(plan))
        cfg = {"plan": str(work / "plan.json"), "steps": args.steps, "repeats": args.repeats, "dim": args.dim,
               "layers": args.layers, "batch": args.batch, "seq": args.seq, "vocab": 1024, "backend": args.backend}
        results = spawn(body, cfg, RANKS, work)
    print(f"PP {RANKS} (gloo, 1 thread per rank), {MICROBATCHES} microbatches, Llama-style {args.layers} blocks of "
          f"width {args.dim}, batch {args.batch} x seq {args.seq}, backend {args.backend}; step ms = median of "
          f"{args.steps} steps, slowest rank; first step s = metadata inference (+ compilation), slowest rank")
    print(machine_line())
    print("| run | variant | step ms | vs torch 1F1B compiled | first step s | replays / step (rank 0) | "
          "gradients = eager |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    rows = results[0]["rows"]
    for i, row in enumerate(rows):
        ms = max(res["rows"][i]["ms"] for res in results)
        ref_i = next(j for j, r in enumerate(rows) if r["repeat"] == row["repeat"]
                     and r["variant"] == "torch 1F1B + checkpoint, compiled")
        ref_ms = max(res["rows"][ref_i]["ms"] for res in results)
        first_s = max(res["rows"][i]["first_s"] for res in results)
        same = [res["rows"][i]["same"] for res in results]
        same_text = "-" if same[0] is None else ("yes" if all(same) else "NO")
        print(f"| {row['repeat'] + 1} | {row['variant']} | {ms:.1f} | {ms / ref_ms:.2f} | {first_s:.1f} | "
              f"{row['replays']:g} | {same_text} |")


if __name__ == "__main__":
    main()
