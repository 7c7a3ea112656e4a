"""Zero-bubble under a budget on torch's stages: PlannedSchedule's peaks against the plans.

budget_runs.sh measures the plan runner; this measures PlannedSchedule (torch.distributed
.pipelining stages) on the held-out decoder of examples/pipelining, its costs measured here
(``python -m hp_recompute.costs --module``). B is 1F1B's checkpoint-all peak at 2 ranks x 4
microbatches; each schedule family is planned within MULTIPLE x B (``--checkpoint auto
--prefetch bubble --memory-budget``) and run on 2 gloo processes: the stages built as
examples/pipelining/train.py builds them (its ``prepare``: the regions the plan checkpoints
wrapped, selective where it says so), a warm-up step, then one step under the allocator's
events from zeroed gradients (peak bytes above the step's start, as the plan counts), its
gradients against the whole model's (the mean of the microbatches' losses).

Usage: budget_stages.py [MULTIPLE] (default 1.5; a bad value exits 2 with usage)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/
from harness import REPO, example_module, machine_line, spawn, training_step  # noqa: E402

EXAMPLE = REPO / "examples" / "pipelining"
RANKS, MICROBATCHES, BATCH = 2, 4, 64
FAMILIES = ["1f1b", "interleaved-1f1b", "zb-h1", "interleaved-zb", "zbv", "dualpipev", "auto"]


def _example(name: str) -> Any:
    """examples/pipelining's ``name``.py."""
    return example_module(f"hpr_pipelining_{name}", EXAMPLE / f"{name}.py")


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def _batch() -> List[torch.Tensor]:
    decoder = _example("model")
    tokens = torch.randint(0, decoder.VOCAB, (BATCH, decoder.SEQ), generator=torch.Generator().manual_seed(7))
    return [tokens, tokens.roll(-1, dims=1)]  # the next token


def body(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    from torch.distributed.pipelining import PipelineStage

    from hp_recompute.pipelining import PlannedSchedule
    from hp_recompute.runner.memory import AllocatorPeak

    decoder, train = _example("model"), _example("train")
    plan = json.loads(Path(cfg["plan"]).read_text())
    stage_to_rank = plan["schedule"]["stage_to_rank"]
    tokens, target = _batch()
    reference = decoder.build()
    for x, y in zip(tokens.chunk(MICROBATCHES), target.chunk(MICROBATCHES)):
        (_loss(reference(x), y) / MICROBATCHES).backward()
    want = {n: p.grad for n, p in reference.named_parameters()}
    stages = []
    for s in [s for s, r in enumerate(stage_to_rank) if r == rank]:
        regions = plan["model"]["stages"][s]["regions"]
        module = decoder.stage_module(decoder.build(), [r["name"] for r in regions])
        train.prepare(module, regions, None, True, None)
        stages.append(PipelineStage(module, s, len(stage_to_rank), torch.device("cpu")))
    schedule = PlannedSchedule(stages, MICROBATCHES, loss_fn=_loss, plan=cfg["plan"])
    step = training_step(schedule, stages, tokens, target)
    with AllocatorPeak():  # warm-up: torch infers the stages' metadata (runner/memory.py: profiled)
        step()
    for st in stages:
        st.submod.zero_grad(set_to_none=True)
    with AllocatorPeak() as meter:
        step()
    exact = all(p.grad is not None and torch.allclose(p.grad, want[n.replace("_checkpoint_wrapped_module.", "")],
                                                      rtol=1e-5, atol=1e-7)
                for st in stages for n, p in st.submod.named_parameters())
    return {"peak": meter.peak, "exact": exact}


def main() -> None:
    from hp_recompute import make_plan

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("multiple", nargs="?", type=float, default=1.5,
                        help="the budget, in 1F1B's checkpoint-all peaks (default 1.5)")
    multiple = parser.parse_args().multiple
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        costed = work / "decoder.costed.json"
        subprocess.run([sys.executable, "-m", "hp_recompute.costs", "--module", f"{EXAMPLE / 'model.py'}:build",
                        "--input-shape", f"{BATCH // MICROBATCHES}x{_example('model').SEQ}", "--input-dtype", "int64",
                        "-o", str(costed)], check=True, stdout=subprocess.DEVNULL)
        sizes = {"model": costed, "ranks": RANKS, "microbatches": MICROBATCHES}
        unit = max(make_plan(schedule_gen="1f1b", checkpoint="all", **sizes)["summary"]["peak_bytes"])
        budget = int(multiple * unit)
        print(f"{RANKS} ranks x {MICROBATCHES} microbatches, the decoder of examples/pipelining (costs measured here), "
              f"batch {BATCH}; budget {budget} bytes of activations = {multiple} x 1F1B's checkpoint-all peak; "
              f"--checkpoint auto --prefetch bubble; PlannedSchedule on torch's stages, 2 gloo processes")
        print(machine_line())
        print("| schedule | plan | dw, B | planned peak rank 0, 1 | measured peak rank 0, 1 (allocator) "
              "| measured / planned | gradients exact |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for family in FAMILIES:
            plan = make_plan(schedule_gen=family, checkpoint="auto", prefetch="bubble", memory_budget=budget, **sizes)
            path = work / f"{family}.json"
            path.write_text(json.dumps(plan))
            (work / family).mkdir()
            results = spawn(body, {"plan": str(path)}, RANKS, work / family)
            planned = plan["summary"]["peak_memory_bytes"]
            measured = [res["peak"] for res in results]
            ops = [a["op"] for r in plan["ranks"] for a in r["actions"]]
            print(f"| {family} | {plan['schedule']['name']} | {ops.count('backward_weight')}, {ops.count('backward')} | "
                  f"{', '.join(map(str, planned))} | {', '.join(map(str, measured))} | "
                  f"{', '.join(f'{m / p:.2f}' for m, p in zip(measured, planned))} | "
                  f"{'yes' if all(res['exact'] for res in results) else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
