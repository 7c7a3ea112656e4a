"""Measure each region's forward, dx and dw time: ``python -m hp_recompute.costs``.

Why here, on the runner's regions: the planner's simulated step time is only worth
comparing with a real run when its costs are those of the code that runs. This runs the
model's regions (``runner.model.PipelineModel``, the same functions the runner executes)
one after another, each on a detached input, and times per region the forward, the dx
(``backward_split.backward_input``) and the dw (``backward_split.backward_weight``) as
the runner calls them, on this torch and with the runner's thread count. Each of
``--repeats`` rounds runs the whole chain forward then backward; the first ``--warmup``
rounds are dropped and the median of the rest is written into a copy of the model JSON
(``fwd_time_us``, ``bwd_input_time_us``, ``bwd_weight_time_us``, one full backward
``bwd_time_us`` (a single call: no split analysis, one graph task), and the bytes of the
gradients I keeps for W, ``bwd_weight_input_bytes``, and the transient bytes of its
backward, ``bwd_workspace_bytes``, measured once at the allocator). Checkpointable regions
are also run as the runner runs them when checkpointed: the forward under
``hp_recompute.checkpoint`` (``checkpoint_fwd_time_us``: its saved tensors go to holders)
and one replay through ``recompute_handle`` (``replay_time_us``).

``--from-run REPORT`` measures nothing: it takes the costs from a run instead
(``python -m hp_recompute.run --report``, multi-process). Each of the report's
``measured_action_us`` (the median time of one action of one stage in that run) scales
the region times the planner sums for that action (the planner's own rule,
``regionTimeOf`` in lib/Analysis/CostModel.cpp, through ``hp_recompute._planner``) by measured / priced,
starting from the costs the run's plan was priced with. Planned again with these costs,
the simulated step uses the durations the actions had in the run, under the same
contention, so that the comparison of simulated and measured step time tests the
timeline, not the repeatability of a separate measurement.

``--processes N`` measures in N processes at once and takes the median over all of them:
ranks that share a machine slow each other down (caches, memory bandwidth, SMT siblings;
on the 2-core VM of bench/run two processes run each op 1.5-1.8x slower than one), so
costs for an N-rank run on one machine are measured N at a time.

    python -m hp_recompute.costs --model-json examples/gpt/gpt.model.json -o gpt.costed.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .backward_split import backward_input, backward_weight
from .checkpoint import checkpoint, recompute_handle_collector_ctx
from .factory import raised_at
from .output_files import OutputError, check_outputs, text_writer, write_outputs
from .runner.model import DEFAULT_MODEL, PipelineModel, load_model
from .runner.memory import AllocatorPeak
from .plan.reader import RunError, read_json
from .plan.verify import planner_extension
from .sessions import clear_recompute_session, recompute_handle
from .storage import storage_of

__all__ = ["measure_region_times", "measure_concurrently", "times_from_run", "main"]

TIME_KEYS = ("fwd_time_us", "bwd_input_time_us", "bwd_weight_time_us", "bwd_time_us")
CHECKPOINT_KEYS = ("checkpoint_fwd_time_us", "replay_time_us")
BYTES_KEYS = ("bwd_weight_input_bytes", "bwd_workspace_bytes")
_SESSION = "hp_recompute.costs"


def _leaf(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().requires_grad_(True)
    return x


def _distinct_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None entries skipped)."""
    seen: Dict[int, int] = {}
    for t in tensors:
        if t is not None:
            storage = storage_of(t)
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _backward_workspace(out: torch.Tensor, grads_out: Any, inputs: List[torch.Tensor],
                        weights: List[torch.Tensor]) -> int:
    """Transient bytes of a region's backward: the allocator peak above what it leaves behind,
    the largest of I, W and one full backward (B)."""
    meters = [AllocatorPeak() for _ in range(3)]
    with meters[0]:
        _, state = backward_input([out], grads_out, inputs, weights, retain_graph=True)
    with meters[1]:
        backward_weight(state, retain_graph=True)
    if inputs or weights:
        with meters[2]:
            torch.autograd.grad([out], inputs + weights, grads_out, allow_unused=True)
    return max((m.peak or 0) - max(m.net or 0, 0) for m in meters)


def _checkpointed_times(region: Any, inp: Any, batch: Any) -> Tuple[float, float]:
    """(forward under checkpoint, one replay) of ``region`` on ``inp``, in seconds."""
    t0 = time.perf_counter()
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(region.fn, inp, batch)
    t1 = time.perf_counter()
    for handle in handles:
        recompute_handle(handle, _SESSION)
    t2 = time.perf_counter()
    clear_recompute_session(_SESSION)
    del out
    return t1 - t0, t2 - t1


def measure_region_times(model: PipelineModel, batch: Any, repeats: int, warmup: int) -> Dict[str, Dict[str, float]]:
    """Median times of every region, in microseconds (TIME_KEYS; CHECKPOINT_KEYS if checkpointable)."""
    params = dict(model.module.named_parameters())
    state_bytes: Dict[str, int] = {}
    workspace: Dict[str, int] = {}
    samples: Dict[str, Dict[str, List[float]]] = {
        r.name: {k: [] for k in TIME_KEYS + (CHECKPOINT_KEYS if r.checkpointable else ())} for r in model.regions}
    for round_ in range(repeats):
        chain = []
        x = batch
        for index, region in enumerate(model.regions):
            inp = x if index == 0 else _leaf(x)  # as the runner: stage 0 gets the batch as it is
            t0 = time.perf_counter()
            out = region.fn(inp, batch)
            chain.append((region, inp, out, time.perf_counter() - t0))
            if region.checkpointable and round_ >= warmup:
                for key, seconds in zip(CHECKPOINT_KEYS, _checkpointed_times(region, inp, batch)):
                    samples[region.name][key].append(seconds * 1e6)
            x = out
        grad: Optional[torch.Tensor] = None
        for region, inp, out, fwd_s in reversed(chain):
            weights = [params[n] for n in region.params if params[n].requires_grad]
            inputs = [inp] if isinstance(inp, torch.Tensor) and inp.requires_grad else []
            grads_out = None if grad is None else [grad]
            if round_ == warmup:  # once, under the allocator meter: not timed
                workspace[region.name] = _backward_workspace(out, grads_out, inputs, weights)
                out = region.fn(inp, batch)
            t0 = time.perf_counter()
            dxs, state = backward_input([out], grads_out, inputs, weights)
            t1 = time.perf_counter()
            kept = _distinct_bytes(g for grads in state.recorded.values() for g in grads)
            backward_weight(state)
            t2 = time.perf_counter()
            again = region.fn(inp, batch)  # B is one call: time it on a fresh graph
            t3 = time.perf_counter()
            if inputs or weights:
                torch.autograd.grad([again], inputs + weights, grads_out, allow_unused=True)
            t4 = time.perf_counter()
            grad = dxs[0] if inputs else None
            if round_ >= warmup:
                for key, seconds in zip(TIME_KEYS, (fwd_s, t1 - t0, t2 - t1, t4 - t3)):
                    samples[region.name][key].append(seconds * 1e6)
                state_bytes[region.name] = kept
    out: Dict[str, Dict[str, float]] = {}
    for name, keys in samples.items():
        out[name] = {k: statistics.median(v) for k, v in keys.items()}
        out[name][BYTES_KEYS[0]] = state_bytes[name]
        out[name][BYTES_KEYS[1]] = workspace[name]
    return out


def _measure_in_child(queue: Any, start: Any, spec: Optional[str], seed: int, repeats: int, warmup: int,
                      threads: int) -> None:
    try:
        torch.set_num_threads(threads)
        model = load_model(spec)
        batch = model.make_batch(torch.Generator().manual_seed(seed))
        start.wait()  # every process measures at the same time
        queue.put(("ok", measure_region_times(model, batch, repeats, warmup)))
    except threading.BrokenBarrierError:  # another process failed first and says why
        queue.put(("aborted", None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        start.abort()
        queue.put(("error", str(e) if isinstance(e, RunError) else raised_at(e)))


def measure_concurrently(spec: Optional[str], seed: int, repeats: int, warmup: int, threads: int,
                         processes: int) -> Dict[str, Dict[str, float]]:
    """``measure_region_times`` in ``processes`` processes at once; the median over them."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue, start = ctx.Queue(), ctx.Barrier(processes)
    procs = [ctx.Process(target=_measure_in_child, args=(queue, start, spec, seed, repeats, warmup, threads))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    results: List[Dict[str, Dict[str, float]]] = []
    aborted = 0
    try:
        while len(results) + aborted < processes:
            try:
                kind, value = queue.get(timeout=1)
            except Exception:  # queue.Empty: is everyone still alive?
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RunError(f"hp_recompute.costs: a measuring process died (exit code {dead[0]})") from None
                continue
            if kind == "error":
                raise RunError(f"hp_recompute.costs: measuring the model failed: {value}")
            if kind == "aborted":
                aborted += 1
                continue
            results.append(value)
        if aborted:
            raise RunError("hp_recompute.costs: measuring the model failed: the processes' start barrier broke")
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
    return {name: {k: keys[k] if k.endswith("_bytes") else statistics.median(r[name][k] for r in results)
                   for k in keys}  # bytes are the same in every process
            for name, keys in results[0].items()}


def _finite(value: Any) -> bool:
    """A JSON number the planner reads: not a boolean, not NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def times_from_run(names: Sequence[str], report_path: str,
                   output: Optional[Tuple[str, str]] = None) -> Dict[str, Dict[str, float]]:
    """Region times from a run's report (module docstring, ``--from-run``) for the regions ``names``.

    The starting point is the plan the run executed: its regions carry the costs it was
    priced with. A forward's plain and checkpointed runs share the plain regions'
    ``fwd_time_us``; the plain forward's ratio is applied last. ``output`` (flag, path), the
    file the times go to, must not be that plan (NOTE [ Output files ] Rule 6: OutputError)."""
    report = read_json(report_path, "run report")
    ranks = report.get("ranks") if isinstance(report, dict) else None
    if not isinstance(ranks, list) or not all(isinstance(r, dict) and "measured_action_us" in r for r in ranks):
        raise RunError(f"hp_recompute.costs: {report_path}: /ranks: expected measured_action_us per rank "
                       f"(a multi-process report of python -m hp_recompute.run)")
    for i, rank in enumerate(ranks):
        for j, m in enumerate(rank["measured_action_us"]):
            if not (isinstance(m, dict) and isinstance(m.get("op"), str) and isinstance(m.get("stage"), int)
                    and isinstance(m.get("plain"), bool) and _finite(m.get("median_us")) and m["median_us"] >= 0):
                raise RunError(f"hp_recompute.costs: {report_path}: /ranks/{i}/measured_action_us/{j}: expected "
                               f"an object with op, stage, plain and median_us (a finite number >= 0)")
    if not isinstance(report.get("plan"), str):
        raise RunError(f"hp_recompute.costs: {report_path}: /plan: expected the path of the plan the run executed")
    plan_path = report["plan"]
    if output is not None:
        check_outputs([output], [("--from-run's /plan", plan_path)])
    plan = read_json(plan_path, "plan the run executed")
    try:
        stages = {st["stage"]: st["regions"] for st in plan["model"]["stages"]}
        priced = {r["name"]: r for regions in stages.values() for r in regions}
        checkpointed = {r["name"]: bool(r["checkpoint"]) for r in priced.values()}
    except (KeyError, TypeError, AttributeError):
        raise RunError(f"hp_recompute.costs: {plan_path}: /model/stages: expected stages of named regions "
                       f"(a plan JSON of hp-recompute-plan)") from None
    if sorted(priced) != sorted(names):
        raise RunError(f"hp_recompute.costs: {plan_path}: its regions [{', '.join(priced)}] are not the model "
                       f"JSON's [{', '.join(names)}]")
    times: Dict[str, Dict[str, float]] = {}
    for name, region in priced.items():
        keys = TIME_KEYS + (CHECKPOINT_KEYS if region.get("checkpointable") else ())
        missing = [k for k in keys if not _finite(region.get(k)) or region[k] <= 0]
        if missing:
            raise RunError(f"hp_recompute.costs: {plan_path}: region '{name}' has no {missing[0]}: plan with "
                           f"costs measured by python -m hp_recompute.costs before taking them from a run")
        times[name] = {k: float(region[k]) for k in keys}
        times[name].update({k: region[k] for k in BYTES_KEYS if k in region})  # measured with the times
    planner = planner_extension()
    for rank in ranks:
        for measured in rank["measured_action_us"]:
            op, stage, plain = measured["op"], measured["stage"], measured["plain"]
            # The region fields the planner sums into this action's time (regionTimeOf).
            fields = [(r["name"], planner.region_time_field(op, stage, not plain, checkpointed[r["name"]]))
                      for r in stages.get(stage, [])]
            fields = [(name, key) for name, key in fields if key]
            modelled = sum(times[name][key] for name, key in fields)
            if modelled > 0:
                for name, key in fields:
                    times[name][key] *= measured["median_us"] / modelled
    return times


#: Bounds of the numeric flags (a usage error outside them, not a measurement that never ends).
MAX_REPEATS = 10_000
MAX_THREADS = 1024
MAX_PROCESSES = 64
MAX_SEED = 1 << 63


def _non_finite(graph: Dict[str, Any], times: Dict[str, Dict[str, float]]) -> Optional[str]:
    """The JSON path of the first written time or byte count that is NaN or infinite, or None."""
    for i, region in enumerate(graph["regions"]):
        for key, value in times[region["name"]].items():
            if not math.isfinite(value):
                return f"/regions/{i}/{key} (region '{region['name']}') is {value}"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 1 bad input, 2 usage)."""
    p = argparse.ArgumentParser(prog="python -m hp_recompute.costs", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-json", required=True, help="model JSON whose region names are the model's regions")
    p.add_argument("--model", default=None, help="FILE.py:FACTORY (default: the bundled GPT example)")
    p.add_argument("-o", "--output", required=True,
                   help="where to write the model JSON with measured times (- for stdout)")
    p.add_argument("--repeats", type=int, default=12, help="rounds, default 12")
    p.add_argument("--warmup", type=int, default=2, help="rounds dropped first, default 2")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the runner's ranks)")
    p.add_argument("--processes", type=int, default=1,
                   help="measure in this many processes at once, as many ranks share the machine (default 1)")
    p.add_argument("--seed", type=int, default=0, help="data seed of the measured microbatch")
    p.add_argument("--from-run", default=None, metavar="REPORT",
                   help="measure nothing: take the times from this run report (module docstring)")
    args = p.parse_args(argv)
    if not 1 <= args.repeats <= MAX_REPEATS:
        p.error(f"--repeats must be in [1, {MAX_REPEATS}], got {args.repeats}")
    if not 0 <= args.warmup < args.repeats:
        p.error(f"--warmup must be in [0, --repeats), got {args.warmup} with --repeats {args.repeats}")
    if not 1 <= args.threads <= MAX_THREADS:
        p.error(f"--threads must be in [1, {MAX_THREADS}], got {args.threads}")
    if not 1 <= args.processes <= MAX_PROCESSES:
        p.error(f"--processes must be in [1, {MAX_PROCESSES}], got {args.processes}")
    if not 0 <= args.seed < MAX_SEED:
        p.error(f"--seed must be in [0, 2^63), got {args.seed}")
    for flag, value in (("--model-json", args.model_json), ("--model", args.model), ("--from-run", args.from_run)):
        if value == "":
            p.error(f"{flag}: an empty value")
    output = ("-o", args.output)
    inputs = [("--model-json", args.model_json), ("--model", args.model.rpartition(":")[0] if args.model else DEFAULT_MODEL)]
    if args.from_run is not None:
        inputs.append(("--from-run", args.from_run))
    try:
        check_outputs([output], inputs)
        graph = read_json(args.model_json, "model JSON")
        regions = graph.get("regions") if isinstance(graph, dict) else None
        if not isinstance(regions, list) or not all(isinstance(r, dict) and "name" in r for r in regions):
            raise RunError(f"hp_recompute.costs: {args.model_json}: /regions: expected a list of region objects")
        if args.from_run is not None:
            times = times_from_run([r["name"] for r in regions], args.from_run, output)
            source = f"times: python -m hp_recompute.costs --from-run {os.path.basename(args.from_run)}"
        else:
            times = _measure(args, regions)
            source = (f"times: python -m hp_recompute.costs, torch {torch.__version__}, {args.threads} thread(s) "
                      f"x {args.processes} process(es), median of {args.repeats - args.warmup}")
        bad = _non_finite(graph, times)
        if bad:  # the planner reads finite numbers only: writing this would only defer the error
            raise RunError(f"hp_recompute.costs: -o {args.output}: not written: {bad}; the planner reads only "
                           f"finite numbers" + (f" (check the times in {args.from_run})" if args.from_run else ""))
    except OutputError as e:
        print(f"hp_recompute.costs: {e}", file=sys.stderr)
        return 2 if e.usage else 1
    except RunError as e:
        print(e, file=sys.stderr)
        return 1
    for region in regions:
        region.update({k: v if k.endswith("_bytes") else round(v, 3) for k, v in times[region["name"]].items()})
    graph["source"] = f"{graph.get('source', '')}; {source}".lstrip("; ")
    try:
        write_outputs([("-o", args.output, text_writer(json.dumps(graph, indent=2, allow_nan=False) + "\n"))])
    except OutputError as e:
        print(f"hp_recompute.costs: {e}", file=sys.stderr)
        return 1
    table = sys.stderr if args.output == "-" else sys.stdout  # stdout holds the JSON then
    print(f"{'region':<12} {'fwd_us':>9} {'dx_us':>9} {'dw_us':>9} {'bwd_us':>9} {'dx/fwd':>7} {'dw/fwd':>7} "
          f"{'ckpt_fwd':>9} {'replay':>9}", file=table)
    for name, t in times.items():
        f, i, w, b = (t[k] for k in TIME_KEYS)
        extra = " ".join(f"{t[k]:9.1f}" for k in CHECKPOINT_KEYS if k in t)
        ratios = f"{i / f:7.2f} {w / f:7.2f}" if f > 0 else f"{'-':>7} {'-':>7}"
        print(f"{name:<12} {f:9.1f} {i:9.1f} {w:9.1f} {b:9.1f} {ratios} {extra}", file=table)
    return 0


def _measure(args: argparse.Namespace, regions: List[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """The measured times of the model's regions, whose names ``regions`` must list in order."""
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    names = [r.name for r in model.regions]
    if [r["name"] for r in regions] != names:
        raise RunError(f"hp_recompute.costs: {args.model_json}: /regions: names "
                       f"[{', '.join(str(r['name']) for r in regions)}] are not model '{model.name}''s regions "
                       f"[{', '.join(names)}]")
    if args.processes > 1:
        return measure_concurrently(args.model, args.seed, args.repeats, args.warmup, args.threads, args.processes)
    batch = model.make_batch(torch.Generator().manual_seed(args.seed))
    try:
        return measure_region_times(model, batch, args.repeats, args.warmup)
    except BaseException as e:  # noqa: BLE001 - the model's own failure, located; SystemExit included
        raise RunError(f"hp_recompute.costs: measuring model '{model.name}' failed: {raised_at(e)}") from None


if __name__ == "__main__":
    sys.exit(main())
