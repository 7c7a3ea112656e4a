"""Real runs of the checkpoint policies: a Llama-style model under PlannedSchedule, 2 gloo ranks.

The model is ``examples/llama/model.py`` (RMSNorm, RoPE, grouped-query SDPA, SwiGLU) at this
file's size (``build``), in torchtitan's stage layout (every stage module keeps the full
model's FQNs). Its costs are measured first, with no adapter, by ``python -m
hp_recompute.costs --module bench/prefetch/policies_run.py:build`` on one microbatch's shape
(in one process: ``--module`` measures in its own, so the planned times are those of one rank
alone on the machine, and the ratios are what compare). Per schedule, five plans
(``make_plan``) run side by side: none (no checkpointing), jit (every block full, replays
just in time), selective jit (every block by the selective policy), auto (none, selective
or full per block within jit's activation peak, the planner's choice) and auto with bubble
placement. Per run: one step for torch's metadata
inference, one whose gradients are compared with none's, then ``--steps`` timed steps
(median, slowest rank); ``--repeats`` runs per variant, taken in turn so that drift hits
every variant.

    .venv/bin/python bench/prefetch/policies_run.py [--steps 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from harness import machine_line, median_step_ms, spawn, training_step  # noqa: E402
RANKS, MICROBATCHES = 2, 4
DIM, LAYERS, SEQ, BATCH, VOCAB = 128, 8, 64, 16, 1024
#: schedule -> the stage split of the regions tok_embeddings, layers.0-7, norm+output (two
#: stages per rank for the multi-stage schedules; which rank runs which is the plan's)
SCHEDULES = {name: "0:0-2,1:3-4,2:5-6,3:7-9" if name in ("zbv", "interleaved-1f1b", "dualpipev") else "0:0-4,1:5-9"
             for name in ("1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev")}
VARIANTS = {"none": dict(checkpoint="none"), "jit": dict(checkpoint="all"),
            "selective jit": dict(checkpoint="selective"), "auto": dict(checkpoint="auto"),
            "auto+bubble": dict(checkpoint="auto", prefetch="bubble")}


def _llama() -> Any:
    from hp_recompute.factory import import_file

    return import_file(str(REPO / "examples" / "llama" / "model.py"), "bench/prefetch", RuntimeError)


def _model(llama: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return llama.Transformer(llama.ModelArgs(dim=DIM, n_layers=LAYERS, n_heads=8, n_kv_heads=4, vocab_size=VOCAB,
                                             max_seq_len=SEQ))


def build() -> torch.nn.Module:
    """The model the runs train, for ``hp_recompute.costs --module`` (seeded)."""
    return _model(_llama())


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _one(rank: int, cfg: Dict[str, Any], schedule_name: str, variant: str, llama: Any, full: Any) -> Dict[str, Any]:
    """One run of ``variant``'s plan of ``schedule_name`` on this rank: the median step and the
    gradients of its second step."""
    from torch.distributed.pipelining import PipelineStage

    import hp_recompute as hr
    from hp_recompute.pipelining import PlannedSchedule

    plan = cfg["plans"][schedule_name][variant]
    stage_to_rank = plan["schedule"]["stage_to_rank"]
    stages_n = len(stage_to_rank)
    mine = [s for s, r in enumerate(stage_to_rank) if r == rank]
    stages = [PipelineStage(llama.stage_module(full, s, stages_n), s, stages_n, torch.device("cpu")) for s in mine]
    schedule = PlannedSchedule(stages, MICROBATCHES, loss_fn=_loss, plan=plan)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    target = tokens.roll(-1, dims=1)
    step = training_step(schedule, stages, tokens, target)

    step()  # torch's metadata inference
    step()
    grads = {name: p.grad.clone() for st in stages for name, p in st.submod.named_parameters()}
    hr.reset_stats()
    ms = median_step_ms(step, cfg["steps"])
    return {"ms": ms, "grads": grads, "replays": hr.stats()["replays"] / cfg["steps"]}


def body(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    llama = _llama()
    full = _model(llama)
    rows = []
    for repeat in range(cfg["repeats"]):
        for schedule_name in SCHEDULES:
            baseline: Dict[str, torch.Tensor] = {}
            for variant in VARIANTS:
                row = _one(rank, cfg, schedule_name, variant, llama, full)
                grads = row.pop("grads")
                baseline = baseline or grads
                same = all(torch.allclose(grads[n], baseline[n], rtol=1e-5, atol=1e-6) for n in grads)
                rows.append({"repeat": repeat, "schedule": schedule_name, "variant": variant, "same": same, **row})
    return {"rows": rows}


def _plans(work: Path) -> Dict[str, Dict[str, Any]]:
    """Costs measured here, then each schedule's plan per variant."""
    from hp_recompute import make_plan

    costed = work / "llama.costed.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    proc = subprocess.run([sys.executable, "-m", "hp_recompute.costs", "--module", f"{__file__}:build",
                           "--input-shape", f"{BATCH // MICROBATCHES}x{SEQ}", "--input-dtype", "int64", "--repeats",
                           "8", "-o", str(costed)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"measuring the costs failed:\n{proc.stderr}")
    plans: Dict[str, Dict[str, Any]] = {}
    for name, split in SCHEDULES.items():
        gen = dict(schedule_gen=name, model=costed, ranks=RANKS, microbatches=MICROBATCHES, stages=split)
        # auto's budget: the checkpoint-all peak, i.e. jit's.
        plans[name] = {variant: make_plan(**gen, **options, **({"memory_budget": "1x"} if "auto" in variant else {}))
                       for variant, options in VARIANTS.items()}
    return plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path[:0] = [str(REPO / "python")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plans = _plans(work)
        results = spawn(body, {"plans": plans, "steps": args.steps, "repeats": args.repeats}, RANKS, work)
    print(f"PP {RANKS} (gloo, 1 thread per rank), {MICROBATCHES} microbatches, Llama-style {LAYERS} blocks of width "
          f"{DIM}, batch {BATCH} x seq {SEQ}; step ms = median of {args.steps} steps, slowest rank; "
          f"{args.repeats} runs per variant, in turn")
    print(machine_line())
    print("| schedule | variant | blocks n/s/f | step ms per run | median ms | vs jit | simulated vs jit | "
          "replays / step (rank 0) | gradients = none |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    rows = results[0]["rows"]
    cells: Dict[tuple, List[int]] = {}
    for i, row in enumerate(rows):
        cells.setdefault((row["schedule"], row["variant"]), []).append(i)
    for name in SCHEDULES:
        jit = statistics.median(max(res["rows"][i]["ms"] for res in results) for i in cells[(name, "jit")])
        sim_jit = plans[name]["jit"]["summary"]["step_time_us"]
        for variant in VARIANTS:
            runs = [max(res["rows"][i]["ms"] for res in results) for i in cells[(name, variant)]]
            plan = plans[name][variant]
            policies = [r["checkpoint"] for s in plan["model"]["stages"] for r in s["regions"] if r["checkpointable"]]
            blocks = "/".join(str(sum(1 for p in policies if p is v or p == v)) for v in (False, "selective", True))
            same = all(res["rows"][i]["same"] for res in results for i in cells[(name, variant)])
            print(f"| {name} | {variant} | {blocks} | {', '.join(f'{ms:.0f}' for ms in runs)} | "
                  f"{statistics.median(runs):.0f} | {statistics.median(runs) / jit:.3f} | "
                  f"{plan['summary']['step_time_us'] / sim_jit:.3f} | {rows[cells[(name, variant)][0]]['replays']:g} | "
                  f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
