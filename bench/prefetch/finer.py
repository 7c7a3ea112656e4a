"""Would finer regions beat whole blocks at the memory of checkpointing every block?

README.md (policies) names finer regions as the next lever for the cells where auto + bubble
misses issue 27's target: checkpoint a block's attention and its MLP as two regions, so that
a replay is smaller and one half can stay plain. This measures it. The Llama-style example is
costed twice on this machine, now, with no adapter (``python -m hp_recompute.costs
--module``): by block, and with ``--regions layers.N.attention,layers.N.feed_forward`` (the
norms and residual adds between them become segments outside regions, as the costs tool
cuts them). A model of two blocks per stage is then built with each stage either by block or
by half-block (attention, MLP and the two add + norm segments between, the fine costing's
middle block), every subset of stages the fine way, stages pinned; each is planned with
``--checkpoint auto --prefetch bubble`` within the peak of checkpointing every block with jit
(torch's checkpoint memory, the by-block model's), and recovered = (jit - plan) / (jit -
none) is against the by-block none and jit. The model format has no nested regions, so a
stage cut the fine way cannot also checkpoint its blocks whole.

    python3 bench/prefetch/finer.py [--build build] [--schedule 1f1b] [--ranks 4] [--processes 2]
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import tempfile
from multiprocessing import Pool
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ceiling import HERE, cell, plan

BLOCKS_PER_STAGE = 2


def cost(fine: bool, out: Path) -> List[Dict[str, Any]]:
    """The example's regions costed by block, or with attention and MLP as regions."""
    repo = HERE.parents[1]
    command = [str(repo / ".venv/bin/python"), "-m", "hp_recompute.costs",
               "--module", str(repo / "examples/llama/model.py:build"),
               "--input-shape", "64x64", "--input-dtype", "int64", "--repeats", "8", "-o", str(out)]
    if fine:
        halves = (f"layers.{i}.{half}" for i in range(4) for half in ("attention", "feed_forward"))
        command += ["--regions", ",".join(halves)]
    # The FLOP-rule warnings (complex views of RoPE) are the costs tool's, not news here.
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.read_text())["regions"]


def mixed_model(by_block: List[Dict[str, Any]], fine: List[Dict[str, Any]], stages: int,
                fine_stages: Sequence[int]) -> Dict[str, Any]:
    """Two blocks per stage; the stages in ``fine_stages`` cut each block into halves."""
    by_name = {r["name"]: r for r in fine}
    block = next(r for r in by_block if r["name"] == "layers.1")
    # One block's halves: add + attention norm (before), attention, add + MLP norm, MLP.
    halves = [("pre", by_name["layers.0+layers.1"]), ("attention", by_name["layers.1.attention"]),
              ("mid", by_name["layers.1"]), ("feed_forward", by_name["layers.1.feed_forward"])]
    regions = [dict(by_block[0], stage=0)]
    for stage in range(stages):
        for i in range(stage * BLOCKS_PER_STAGE, (stage + 1) * BLOCKS_PER_STAGE):
            if stage in fine_stages:
                regions += [dict(r, name=f"layers.{i}.{half}", stage=stage) for half, r in halves]
            else:
                regions.append(dict(block, name=f"layers.{i}", stage=stage))
    regions.append(dict(by_block[-1], stage=stages - 1))
    return {"name": "llama-mixed", "regions": regions}


def auto_bubble(job: Tuple[str, Dict[str, Any], List[str], int]) -> Optional[float]:
    tool, model, gen, budget = job
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.json"
        path.write_text(json.dumps(model))
        summary = plan(tool, path, gen, "--checkpoint", "auto", "--memory-budget", str(budget), "--prefetch", "bubble")
    return summary["step_time_us"] if summary else None


def main() -> None:
    args, tool, stages, gen = cell(__doc__.splitlines()[0])
    with tempfile.TemporaryDirectory() as tmp:
        by_block, fine = cost(False, Path(tmp) / "block.json"), cost(True, Path(tmp) / "fine.json")
        base = Path(tmp) / "base.json"
        base.write_text(json.dumps(mixed_model(by_block, fine, stages, ())))
        none = plan(tool, base, gen, "--checkpoint", "none")["step_time_us"]
        jit = plan(tool, base, gen)
        budget = max(jit["peak_bytes"])
        subsets = [c for k in range(stages + 1) for c in itertools.combinations(range(stages), k)]
        with Pool(args.processes) as pool:
            steps = pool.map(auto_bubble, [(tool, mixed_model(by_block, fine, stages, c), gen, budget)
                                           for c in subsets], chunksize=4)
    recovered = lambda step: (jit["step_time_us"] - step) / (jit["step_time_us"] - none)
    # subsets[0] is () (every stage by block): checkpointing every block fits, so auto does.
    halves = [(recovered(s), c) for s, c in zip(steps[1:], subsets[1:]) if s is not None]
    label = f"{args.schedule} {args.ranks} x {2 * args.ranks}"
    print(f"| {label} | by block (auto + bubble) | {recovered(steps[0]):.2%} |")
    best, where = max(halves, default=(None, None))
    if best is None:
        print(f"| | none of the {len(subsets) - 1} subsets of stages cut in halves fits | |")
    else:
        print(f"| | best of the {len(subsets) - 1} subsets of stages cut in halves ({len(halves)} fit; stages "
              f"{','.join(map(str, where))}) | {best:.2%} |")


if __name__ == "__main__":
    main()
