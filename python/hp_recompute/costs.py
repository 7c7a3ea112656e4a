"""Measure each region's forward, dx and dw time: ``python -m hp_recompute.costs``.

Why here, on the runner's regions: the planner's simulated step time is only worth
comparing with a real run when its costs are those of the code that runs. This runs the
model's regions (``run_model.PipelineModel``, the same functions the runner executes)
one after another, each on a detached input, and times per region the forward, the dx
(``backward_split.backward_input``) and the dw (``backward_split.backward_weight``) as
the runner calls them, on this torch and with the runner's thread count. Each of
``--repeats`` rounds runs the whole chain forward then backward; the first ``--warmup``
rounds are dropped and the median of the rest is written into a copy of the model JSON
(``fwd_time_us``, ``bwd_input_time_us``, ``bwd_weight_time_us``). A replay runs the
region's forward again, so the planner prices it as ``fwd_time_us``.

    python -m hp_recompute.costs --model-json examples/gpt/gpt.model.json -o gpt.costed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from .backward_split import backward_input, backward_weight
from .run_model import PipelineModel, load_model
from .run_plan import RunError

__all__ = ["measure_region_times", "main"]

TIME_KEYS = ("fwd_time_us", "bwd_input_time_us", "bwd_weight_time_us")


def _leaf(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().requires_grad_(True)
    return x


def measure_region_times(model: PipelineModel, batch: Any, repeats: int, warmup: int) -> Dict[str, Dict[str, float]]:
    """Median forward / dx / dw time of every region, in microseconds."""
    params = dict(model.module.named_parameters())
    samples: Dict[str, Dict[str, List[float]]] = {r.name: {k: [] for k in TIME_KEYS} for r in model.regions}
    for round_ in range(repeats):
        chain = []
        x = batch
        for region in model.regions:
            inp = _leaf(x)
            t0 = time.perf_counter()
            out = region.fn(inp, batch)
            chain.append((region, inp, out, time.perf_counter() - t0))
            x = out
        grad: Optional[torch.Tensor] = None
        for region, inp, out, fwd_s in reversed(chain):
            weights = [params[n] for n in region.params if params[n].requires_grad]
            inputs = [inp] if isinstance(inp, torch.Tensor) and inp.requires_grad else []
            t0 = time.perf_counter()
            dxs, state = backward_input([out], None if grad is None else [grad], inputs, weights)
            t1 = time.perf_counter()
            backward_weight(state)
            t2 = time.perf_counter()
            grad = dxs[0] if inputs else None
            if round_ >= warmup:
                for key, seconds in zip(TIME_KEYS, (fwd_s, t1 - t0, t2 - t1)):
                    samples[region.name][key].append(seconds * 1e6)
    return {name: {k: statistics.median(v) for k, v in keys.items()} for name, keys in samples.items()}


def _write_atomic(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".hpr-costs-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 1 bad input, 2 usage)."""
    p = argparse.ArgumentParser(prog="python -m hp_recompute.costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-json", required=True, help="model JSON whose region names are the model's regions")
    p.add_argument("--model", default=None, help="FILE.py:FACTORY (default: the bundled GPT example)")
    p.add_argument("-o", "--output", required=True, help="where to write the model JSON with measured times")
    p.add_argument("--repeats", type=int, default=12, help="rounds, default 12")
    p.add_argument("--warmup", type=int, default=2, help="rounds dropped first, default 2")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the runner's ranks)")
    p.add_argument("--seed", type=int, default=0, help="data seed of the measured microbatch")
    args = p.parse_args(argv)
    if args.warmup < 0 or args.repeats <= args.warmup:
        p.error("--repeats must exceed --warmup >= 0")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    try:
        try:
            with open(args.model_json) as f:
                graph = json.load(f)
        except (OSError, ValueError) as e:
            raise RunError(f"hp_recompute.costs: {args.model_json}: cannot read the model JSON: {e}") from None
        regions = graph.get("regions") if isinstance(graph, dict) else None
        if not isinstance(regions, list) or not all(isinstance(r, dict) and "name" in r for r in regions):
            raise RunError(f"hp_recompute.costs: {args.model_json}: /regions: expected a list of region objects")
        torch.set_num_threads(args.threads)
        model = load_model(args.model)
        names = [r.name for r in model.regions]
        if [r["name"] for r in regions] != names:
            raise RunError(f"hp_recompute.costs: {args.model_json}: /regions: names "
                           f"[{', '.join(str(r['name']) for r in regions)}] are not model '{model.name}''s regions "
                           f"[{', '.join(names)}]")
        batch = model.make_batch(torch.Generator().manual_seed(args.seed))
        times = measure_region_times(model, batch, args.repeats, args.warmup)
    except RunError as e:
        print(e, file=sys.stderr)
        return 1
    for region in regions:
        region.update({k: round(v, 3) for k, v in times[region["name"]].items()})
    graph["source"] = (f"{graph.get('source', '')}; times: python -m hp_recompute.costs, torch {torch.__version__}, "
                       f"{args.threads} thread(s), median of {args.repeats - args.warmup}").lstrip("; ")
    _write_atomic(args.output, json.dumps(graph, indent=2) + "\n")
    print(f"{'region':<12} {'fwd_us':>9} {'dx_us':>9} {'dw_us':>9} {'dx/fwd':>7} {'dw/fwd':>7}")
    for name, t in times.items():
        f, i, w = (t[k] for k in TIME_KEYS)
        print(f"{name:<12} {f:9.1f} {i:9.1f} {w:9.1f} {i / f:7.2f} {w / f:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
