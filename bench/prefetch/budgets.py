"""Zero-bubble at checkpointing memory: each schedule family under a budget.

For each model and schedule family at RANKS x MICROBATCHES, plans with
``--checkpoint auto --prefetch bubble --memory-budget BYTES`` (the planner bounds dw
deferral, chooses what to checkpoint and places replays within the budget) and reports,
in units of B = 1F1B's checkpoint-all peak (every block checkpointed, replayed jit, the
largest rank's activations):

- the smallest feasible budget of each family (bisection on bytes, to 0.005 B);
- the simulated step at each budget of BUDGETS, as a ratio to the fastest 1F1B-family
  plan (1F1B, interleaved 1F1B) at the same budget; "-" where the family has no plan.

A family whose stages the model cannot fill (more stages than regions) is left out.
Usage: budgets.py PLANNER MODEL.json [MODEL.json ...]
       (env: RANKS=4 MICROBATCHES=8 BUDGETS="1 1.5 2 3")
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

FAMILIES = ["1f1b", "interleaved-1f1b", "zb-h1", "interleaved-zb", "zbv", "dualpipev"]
ONE_F_ONE_B = ["1f1b", "interleaved-1f1b"]


def plan(tool: str, model: str, family: str, extra: List[str]) -> Optional[dict]:
    """The plan JSON's summary, or None where the planner refuses."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        args = [tool, "--model", model, "--schedule-gen", family, "--ranks", os.environ.get("RANKS", "4"),
                "--microbatches", os.environ.get("MICROBATCHES", "8"), "--emit", "json", "-o", out, *extra]
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode != 0:
            if "cannot split model" in done.stderr:
                raise LookupError(done.stderr.strip())
            return None
        # A plan no runtime would admit is a planner bug, never a cell of the table.
        verified = subprocess.run([tool, "--verify", out], capture_output=True, text=True)
        if verified.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: the plan is refused:\n{verified.stderr}")
        with open(out, encoding="utf-8") as f:
            return json.load(f)["summary"]


def auto(tool: str, model: str, family: str, budget: int) -> Optional[dict]:
    return plan(tool, model, family,
                ["--checkpoint", "auto", "--prefetch", "bubble", "--memory-budget", str(budget)])


def smallest_budget(tool: str, model: str, family: str, unit: int) -> float:
    """The smallest feasible budget, in units, to 0.005."""
    lo, hi = 0.0, 1.0
    while auto(tool, model, family, int(hi * unit)) is None:
        lo, hi = hi, hi * 2
        if hi > 64:
            return float("inf")
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        if auto(tool, model, family, int(mid * unit)) is None:
            lo = mid
        else:
            hi = mid
    return hi


def main(tool: str, models: List[str]) -> None:
    budgets = [float(b) for b in os.environ.get("BUDGETS", "1 1.5 2 3").split()]
    ranks, mb = os.environ.get("RANKS", "4"), os.environ.get("MICROBATCHES", "8")
    rows_min, rows_step = [], []
    for model in models:
        name = os.path.basename(model)
        unit = max(plan(tool, model, "1f1b", ["--checkpoint", "all"])["peak_bytes"])
        families: List[str] = []
        floors: Dict[str, float] = {}
        for family in FAMILIES:
            try:
                floors[family] = smallest_budget(tool, model, family, unit)
            except LookupError:
                continue
            families.append(family)
        rows_min.append(f"| {name} | {unit} | " + " | ".join(
            f"{floors[f]:.3f}" if f in floors else "n/a" for f in FAMILIES) + " |")
        for budget in budgets:
            steps = {f: auto(tool, model, f, int(budget * unit)) for f in families}
            steps = {f: s["step_time_us"] if s else None for f, s in steps.items()}
            base = min((steps[f] for f in ONE_F_ONE_B if steps.get(f)), default=None)
            cells = []
            for f in FAMILIES:
                if f not in families:
                    cells.append("n/a")
                elif steps[f] is None:
                    cells.append("-")
                else:
                    cells.append(f"{steps[f] / base:.3f}" if base else f"{steps[f]:.0f} us")
            best_zb = min((steps[f] for f in families if f not in ONE_F_ONE_B and steps[f]), default=None)
            verdict = f"{best_zb / base:.3f}" if best_zb and base else "-"
            rows_step.append(f"| {name} | {budget:g} B | {base:.0f} | " + " | ".join(cells) + f" | {verdict} |"
                             if base else f"| {name} | {budget:g} B | - | " + " | ".join(cells) + " | - |")
    print(f"Smallest feasible budget, in B (1F1B's checkpoint-all peak), {ranks} ranks x {mb} microbatches, "
          "--checkpoint auto --prefetch bubble:\n")
    print("| model | B bytes | " + " | ".join(FAMILIES) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in FAMILIES) + " |")
    print("\n".join(rows_min))
    print("\nSimulated step / the fastest 1F1B-family plan's at the same budget:\n")
    print("| model | budget | fastest 1F1B-family us | " + " | ".join(FAMILIES) + " | best zero-bubble |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in FAMILIES) + " | ---: |")
    print("\n".join(rows_step))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
