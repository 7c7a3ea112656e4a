"""How far a cell of policies.sh is from the best any stage-uniform choice reaches.

auto's search beyond the exhaustive limit is greedy, so a cell where auto + bubble misses a
target may be the search's fault or the model's. This plans, for one schedule and size of
the costed Llama model (its block repeated two per stage, as policies.sh does), every
per-block policy (none, selective, full) that fits, each planned by the CLI with
``--checkpoint model --prefetch bubble`` within jit's activation peak, and every contiguous
stage split with ``--checkpoint auto --prefetch bubble`` within that budget, and prints the
best of each next to auto + bubble, as recovered = (jit - plan) / (jit - none).

The per-block choices are enumerated rank by rank: a rank's jit peak depends only on the
policies of its own blocks (the schedule fixes each rank's order), and bubble only adds to
a peak, so a choice fits only if each rank's part fits with every other block full. The
fitting parts of each rank (3^blocks-on-the-rank tries) are then combined, and every
combination is planned with bubble. What it cannot try: per-microbatch plain forwards
(auto's refinement adds those), splits of a block (finer.py).

    python3 bench/prefetch/ceiling.py [--build build] [--schedule 1f1b] [--ranks 4] [--processes 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
POLICY = {0: False, 1: "selective", 2: True}
MAX_SPLITS, MAX_CHOICES = 500, 10 ** 4


def plan_json(tool: str, model: Path, gen: Sequence[str], *extra: str) -> Optional[dict]:
    """The plan, or None when the planner refuses (a budget no placement fits)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        proc = subprocess.run([tool, "--model", str(model), *gen, *extra, "--emit", "json", "-o", str(out)],
                              capture_output=True, text=True)
        return json.loads(out.read_text()) if proc.returncode == 0 else None


def plan(tool: str, model: Path, gen: Sequence[str], *extra: str) -> Optional[dict]:
    """The plan's summary, or None when the planner refuses."""
    planned = plan_json(tool, model, gen, *extra)
    return planned["summary"] if planned else None


def with_policies(model: Path, choice: Sequence[int], tmp: Path) -> Path:
    """The model with its checkpointable regions' policies set to ``choice`` (POLICY codes)."""
    data = json.loads(model.read_text())
    blocks = iter(choice)
    for region in data["regions"]:
        if region["checkpointable"]:
            region["checkpoint"] = POLICY[next(blocks)]
    fixed = tmp / "fixed.json"
    fixed.write_text(json.dumps(data))
    return fixed


def rank_part_fits(job: Tuple[str, Path, List[str], int, int, Tuple[int, ...]]) -> bool:
    """Whether one rank's blocks under ``choice`` keep that rank within the budget with jit."""
    tool, model, gen, budget, rank, choice = job
    with tempfile.TemporaryDirectory() as tmp:
        summary = plan(tool, with_policies(model, choice, Path(tmp)), gen, "--checkpoint", "model")
    return summary is not None and summary["peak_bytes"][rank] <= budget


def policy_choice(job: Tuple[str, Path, List[str], int, Tuple[int, ...]]) -> Optional[float]:
    """The step of one per-block policy choice with bubble placement within the budget."""
    tool, model, gen, budget, choice = job
    with tempfile.TemporaryDirectory() as tmp:
        summary = plan(tool, with_policies(model, choice, Path(tmp)), gen, "--checkpoint", "model", "--prefetch",
                       "bubble", "--memory-budget", str(budget))
    return summary["step_time_us"] if summary and max(summary["peak_bytes"]) <= budget else None


def fitting_choices(tool: str, model: Path, gen: List[str], budget: int, jit_plan: dict,
                    pool: Any) -> Tuple[List[Tuple[int, ...]], int]:
    """Every per-block choice whose ranks each fit under jit, and how many choices there are."""
    checkpointable = {r["name"] for r in json.loads(model.read_text())["regions"] if r["checkpointable"]}
    stage_to_rank = jit_plan["schedule"]["stage_to_rank"]
    rank_of = {region["name"]: stage_to_rank[stage["stage"]]
               for stage in jit_plan["model"]["stages"] for region in stage["regions"]}
    block_ranks = [rank_of[r["name"]] for r in json.loads(model.read_text())["regions"]
                   if r["name"] in checkpointable]
    parts = []
    for rank in sorted(set(block_ranks)):
        mine = [i for i, r in enumerate(block_ranks) if r == rank]
        tries = list(itertools.product(range(3), repeat=len(mine)))
        choices = []
        for part in tries:
            choice = [2] * len(block_ranks)
            for i, code in zip(mine, part):
                choice[i] = code
            choices.append(tuple(choice))
        fits = pool.map(rank_part_fits, [(tool, model, gen, budget, rank, c) for c in choices], chunksize=8)
        parts.append([(mine, part) for part, ok in zip(tries, fits) if ok])
    combined = []
    for pick in itertools.product(*parts):
        choice = [2] * len(block_ranks)
        for mine, part in pick:
            for i, code in zip(mine, part):
                choice[i] = code
        combined.append(tuple(choice))
    return combined, 3 ** len(block_ranks)


def split(job: Tuple[str, Path, List[str], int, str]) -> Optional[float]:
    tool, model, gen, budget, spec = job
    summary = plan(tool, model, gen, "--stages", spec, "--checkpoint", "auto", "--memory-budget", str(budget),
                   "--prefetch", "bubble")
    return summary["step_time_us"] if summary else None


def cell(description: str) -> Tuple[argparse.Namespace, str, int, List[str]]:
    """The command line of a one-cell script: its arguments, the planner, the stage count
    (two per rank on the looped schedules) and the generator flags (2 x ranks microbatches)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--build", default=str(HERE.parents[1] / "build"))
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    tool = str(Path(args.build) / "bin" / "hp-recompute-plan")
    stages = args.ranks * (2 if args.schedule in ("interleaved-1f1b", "zbv", "dualpipev") else 1)
    gen = ["--schedule-gen", args.schedule, "--ranks", str(args.ranks), "--microbatches", str(2 * args.ranks)]
    return args, tool, stages, gen


def main() -> None:
    args, tool, stages, gen = cell(__doc__.splitlines()[0])
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model.json"
        subprocess.run([sys.executable, str(HERE / "make_model.py"), str(HERE / "llama.costed.json"),
                        str(2 * stages), str(model)], check=True)
        none = plan(tool, model, gen, "--checkpoint", "none")
        jit_plan = plan_json(tool, model, gen)
        jit = jit_plan["summary"]
        budget = max(jit["peak_bytes"])
        auto = plan(tool, model, gen, "--checkpoint", "auto", "--memory-budget", str(budget), "--prefetch", "bubble")
        regions = len(json.loads(model.read_text())["regions"])
        with Pool(args.processes) as pool:
            fitting_policies, count = fitting_choices(tool, model, gen, budget, jit_plan, pool)
            tried_choices = len(fitting_policies) <= MAX_CHOICES
            choices = pool.map(policy_choice, [(tool, model, gen, budget, c) for c in fitting_policies],
                               chunksize=4) if tried_choices else []
            specs = [",".join(f"{s}:{b[s]}-{b[s + 1] - 1}" for s in range(stages))
                     for cuts in itertools.combinations(range(1, regions), stages - 1)
                     for b in [(0, *cuts, regions)]]
            # Each split is a whole auto + bubble search: beyond a few hundred, not tried.
            tried_splits = len(specs) <= MAX_SPLITS
            splits = pool.map(split, [(tool, model, gen, budget, spec) for spec in specs]) if tried_splits else []
    recovered = lambda step: f"{(jit['step_time_us'] - step) / (jit['step_time_us'] - none['step_time_us']):.2%}"
    fitting = [s for s in choices if s is not None]
    fitting_splits = [(s, spec) for s, spec in zip(splits, specs) if s is not None]
    print(f"| {args.schedule} {args.ranks} x {2 * args.ranks} | auto + bubble | {recovered(auto['step_time_us'])} |")
    if not tried_choices:
        print(f"| | {count} per-block policies, {len(fitting_policies)} fitting rank by rank: not tried "
              f"(more than {MAX_CHOICES}) | |")
    else:
        best = recovered(min(fitting)) if fitting else "none fits"
        print(f"| | best of the {count} per-block policies + bubble ({len(fitting)} fit) | {best} |")
    if not tried_splits:
        print(f"| | {len(specs)} stage splits: not tried (more than {MAX_SPLITS}) | |")
    elif fitting_splits:
        step, spec = min(fitting_splits)
        print(f"| | best of the {len(specs)} stage splits, auto + bubble ({spec}) | {recovered(step)} |")
    else:
        print(f"| | none of the {len(specs)} stage splits fits | |")


if __name__ == "__main__":
    main()
