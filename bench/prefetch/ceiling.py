"""How far a cell of policies.sh is from the best any stage-uniform choice reaches.

auto's search beyond the exhaustive limit is greedy, so a cell where auto + bubble misses a
target may be the search's fault or the model's. This plans, for one schedule and size of
the costed Llama model (its block repeated two per stage, as policies.sh does), every
per-block policy (none, selective, full: 3^blocks choices, each planned by the CLI with
``--checkpoint model --prefetch bubble`` within jit's activation peak), and every contiguous
stage split with ``--checkpoint auto --prefetch bubble`` within that budget, and prints the
best of each next to auto + bubble, as recovered = (jit - plan) / (jit - none). What it
cannot try: per-microbatch plain forwards (auto's refinement adds those), splits of a block.

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
from typing import List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
POLICY = {0: False, 1: "selective", 2: True}


def plan(tool: str, model: Path, gen: Sequence[str], *extra: str) -> Optional[dict]:
    """The plan's summary, or None when the planner refuses (a budget no placement fits)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        proc = subprocess.run([tool, "--model", str(model), *gen, *extra, "--emit", "json", "-o", str(out)],
                              capture_output=True, text=True)
        return json.loads(out.read_text())["summary"] if proc.returncode == 0 else None


def policy_choice(job: Tuple[str, Path, List[str], int, Tuple[int, ...]]) -> Optional[float]:
    """The step of one per-block policy choice with bubble placement within the budget."""
    tool, model, gen, budget, choice = job
    data = json.loads(model.read_text())
    blocks = iter(choice)
    for region in data["regions"]:
        if region["checkpointable"]:
            region["checkpoint"] = POLICY[next(blocks)]
    with tempfile.TemporaryDirectory() as tmp:
        fixed = Path(tmp) / "fixed.json"
        fixed.write_text(json.dumps(data))
        summary = plan(tool, fixed, gen, "--checkpoint", "model", "--prefetch", "bubble", "--memory-budget",
                       str(budget))
    return summary["step_time_us"] if summary and max(summary["peak_bytes"]) <= budget else None


def split(job: Tuple[str, Path, List[str], int, str]) -> Optional[float]:
    tool, model, gen, budget, spec = job
    summary = plan(tool, model, gen, "--stages", spec, "--checkpoint", "auto", "--memory-budget", str(budget),
                   "--prefetch", "bubble")
    return summary["step_time_us"] if summary else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=str(HERE.parents[1] / "build"))
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    tool = str(Path(args.build) / "bin" / "hp-recompute-plan")
    stages = args.ranks * (2 if args.schedule in ("interleaved-1f1b", "zbv", "dualpipev") else 1)
    gen = ["--schedule-gen", args.schedule, "--ranks", str(args.ranks), "--microbatches", str(2 * args.ranks)]
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model.json"
        subprocess.run([sys.executable, str(HERE / "make_model.py"), str(HERE / "llama.costed.json"),
                        str(2 * stages), str(model)], check=True)
        none, jit = plan(tool, model, gen, "--checkpoint", "none"), plan(tool, model, gen)
        budget = max(jit["peak_bytes"])
        auto = plan(tool, model, gen, "--checkpoint", "auto", "--memory-budget", str(budget), "--prefetch", "bubble")
        regions = len(json.loads(model.read_text())["regions"])
        blocks = 2 * stages
        if 3 ** blocks > 10 ** 5:
            sys.exit(f"{3 ** blocks} policy choices: too many to plan one by one")
        with Pool(args.processes) as pool:
            choices = pool.map(policy_choice, [(tool, model, gen, budget, c)
                                               for c in itertools.product(range(3), repeat=blocks)], chunksize=16)
            specs = [",".join(f"{s}:{b[s]}-{b[s + 1] - 1}" for s in range(stages))
                     for cuts in itertools.combinations(range(1, regions), stages - 1)
                     for b in [(0, *cuts, regions)]]
            splits = pool.map(split, [(tool, model, gen, budget, spec) for spec in specs])
    recovered = lambda step: f"{(jit['step_time_us'] - step) / (jit['step_time_us'] - none['step_time_us']):.2%}"
    fitting = [s for s in choices if s is not None]
    best_split = min((s, spec) for s, spec in zip(splits, specs) if s is not None)
    print(f"| {args.schedule} {args.ranks} x {2 * args.ranks} | auto + bubble | {recovered(auto['step_time_us'])} |")
    print(f"| | best of the {3 ** blocks} per-block policies + bubble ({len(fitting)} fit) | "
          f"{recovered(min(fitting))} |")
    print(f"| | best of the {len(specs)} stage splits, auto + bubble ({best_split[1]}) | "
          f"{recovered(best_split[0])} |")


if __name__ == "__main__":
    main()
