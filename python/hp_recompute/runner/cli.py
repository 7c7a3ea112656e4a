"""Execute a plan for real: ``python3 -m hp_recompute.run --plan PLAN.json --world-size N``.

Why: a plan is only worth what it does on a real model. This runner builds the model
(default: the bundled GPT, ``examples/gpt/model.py:pipeline``), splits it into the plan's
stages by region name, executes every rank's action list with the eager session API
(``executor``), and checks the result against a plain step (``reference``):

* ``grads_match``: every parameter gradient and the loss equal the plain, non-pipelined,
  non-checkpointed step on the same data and weights (bit-exact with ``--single-process``,
  ``allclose`` across processes);
* ``recomputes``: replays the runtime executed (``hp_recompute.stats()["replays"]``),
  against ``recomputes_expected`` (one per checkpointed plan region of each session, and one more
  for each region of a session the plan replays again for its dw; equal to ``sessions`` when each
  session replays one region once);
* ``sessions_left``: sessions of the run's ranks still live after each step, must be 0;
* ``buffers_match``: buffers a forward updates (BatchNorm statistics) equal the plain step's;
* per rank (multi-process), the peak bytes measured at the allocator next to the plan's
  ``peak_memory_bytes``, and the measured step and busy time next to the simulated ones.

Exit 0 only when all of them hold. Multi-process mode spawns N processes (gloo, 127.0.0.1,
free port, ``multiprocess``); under torchrun each process is one rank (``torchrun``);
``--single-process`` runs all ranks in this process with a ready-queue over ranks and
in-memory transfers; with ``--device DEV`` (an accelerator, e.g. ``cuda``) it runs the
model, the reference and the transfers there, synchronises the device around each timed
step and reports the step's peak at the device allocator (``device_peak_bytes``). Every
mode refuses a broken plan first (``plan.verify``, the C++ verifier). See docs/runner.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .reference import (buffer_snapshot, check_regions, compare, make_batches, microbatch_seeds, reference_step,
                        sgd_update, sum_losses, updated_buffers)
from .executor import MODES, MemoryTransport
from .memory import peak_meter
from .model import DEFAULT_MODEL, StageSpec, load_model, split_stages, stage_names
from .steps import StepDriver
from ..errors import RunError
from ..factory import raised_at
from ..output_files import STDOUT, OutputError, check_outputs, text_writer, write_outputs
from ..plan.reader import Plan
from ..plan.verify import load_plan
from ..replay_state import device_module

__all__ = ["main", "run", "REPORT_FORMAT"]

REPORT_FORMAT = "hp-recompute-run-report"


#: Bounds of the numeric flags (a usage error outside them, not a run that never ends).
MAX_STEPS = 100_000
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_THREADS = 1024
MAX_WORLD_SIZE = 4096
#: Seeds in [0, MAX_SEED): every microbatch seed derived from one (``reference.microbatch_seeds``)
#: stays below 2^63, which ``torch.Generator.manual_seed`` takes.
MAX_SEED = 2**40
#: Largest side of ``--input-shape``.
MAX_INPUT_SIDE = 1 << 20


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m hp_recompute.run",
                                description="Execute an hp-recompute plan and check it against a plain step.")
    p.add_argument("--plan", required=True, help="plan JSON (hp-recompute-plan --emit json)")
    p.add_argument("--model", default=None, help="FILE.py:FACTORY (default: the bundled GPT example)")
    p.add_argument("--input-shape", default=None, metavar="BxS",
                   help="a Hugging Face causal LM's microbatch of input ids (default 2x64, at most its positions)")
    p.add_argument("--world-size", type=int, default=None, help="processes; must equal the plan's ranks")
    p.add_argument("--report", default=None, help="write the JSON report here (- for stdout)")
    p.add_argument("--steps", type=int, default=1, help="training steps (SGD between steps), default 1")
    p.add_argument("--single-process", action="store_true", help="run every rank in this process")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a transfer may wait (default 60)")
    p.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    p.add_argument("--checkpoint-mode", choices=MODES, default="plan",
                   help="plan: the plan's sessions (default); native: torch.utils.checkpoint; none: no checkpoint "
                        "(for benchmarks: the last two do not check recomputes against the plan)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--quiet", action="store_true", help="print only errors")
    p.add_argument("--device", default="cpu",
                   help="with --single-process: run on this device (cuda, cuda:1, ...); default cpu")
    args = p.parse_args(argv)
    if not 1 <= args.steps <= MAX_STEPS:
        p.error(f"--steps must be in [1, {MAX_STEPS}], got {args.steps}")
    if not 0 < args.timeout <= MAX_TIMEOUT_S:  # also refuses nan
        p.error(f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {args.timeout:g}")
    if args.world_size is not None and not 1 <= args.world_size <= MAX_WORLD_SIZE:
        p.error(f"--world-size must be in [1, {MAX_WORLD_SIZE}], got {args.world_size}")
    if not 1 <= args.threads <= MAX_THREADS:
        p.error(f"--threads must be in [1, {MAX_THREADS}], got {args.threads}")
    if not 0 <= args.seed < MAX_SEED:
        p.error(f"--seed must be in [0, 2^40), got {args.seed}")
    for flag, value in (("--plan", args.plan), ("--model", args.model)):
        if value == "":
            p.error(f"{flag}: an empty value")
    if args.input_shape is not None:
        parts = args.input_shape.split("x")
        if len(parts) != 2 or not all(part.isdigit() and 1 <= int(part) <= MAX_INPUT_SIDE for part in parts):
            p.error(f"--input-shape: expected BATCHxSEQUENCE, two integers in [1, {MAX_INPUT_SIDE}] (e.g. 2x64), "
                    f"got '{args.input_shape}'")
        args.input_shape = tuple(int(part) for part in parts)
    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError):
        p.error(f"--device: not a torch device: '{args.device}' (e.g. cpu, cuda, cuda:1)")
    if device.type != "cpu" and not args.single_process:
        p.error(f"--device {args.device} needs --single-process (the multi-process and torchrun ranks run on "
                f"the CPU over gloo)")
    return args


def _device(args: argparse.Namespace) -> torch.device:
    """``--device``, checked to be usable on this machine (RunError otherwise)."""
    device = torch.device(args.device)
    if device.type == "cpu":
        return device
    module = device_module(device.type)
    if module is None or not getattr(module, "is_available", lambda: False)():
        raise RunError(f"hp_recompute.run: --device {args.device}: no {device.type} device is available to torch "
                       f"{torch.__version__}; run on a machine with one, or drop --device")
    return device


def expected_recomputes(plan: Plan) -> int:
    """Replays one step must run: each session replays the regions the plan lists for it once, and once more
    where the plan replays it again for its dw (hpr.exec.replay-for-weight)."""
    again = [a.session for program in plan.ranks for a in program if a.op == "recompute" and a.for_weight]
    return sum(len(s["regions"]) for s in plan.sessions.values()) + sum(len(plan.sessions[s]["regions"]) for s in again)


# -- single process --------------------------------------------------------------------------


def run_single(plan: Plan, args: argparse.Namespace) -> Dict[str, Any]:
    """All ranks in this process (``StepDriver``), transfers as in-memory handoffs."""
    torch.set_num_threads(args.threads)
    device = _device(args)
    model = load_model(args.model, device, args.input_shape)
    ref = load_model(args.model, device, args.input_shape)
    ref.module.load_state_dict(model.module.state_dict())
    specs = split_stages(plan, model)
    ref_specs = split_stages(plan, ref)
    driver = StepDriver(plan, model, specs, MemoryTransport(), range(plan.num_ranks), args.checkpoint_mode)
    order = plan.weight_grad_order()
    steps: List[Dict[str, Any]] = []
    check_regions(model, make_batches(model, args.seed, 0, 1)[0])
    for step in range(args.steps):
        seeds = microbatch_seeds(args.seed, step, plan.num_microbatches)
        batches = make_batches(model, args.seed, step, plan.num_microbatches)
        ref_buffers = buffer_snapshot(ref.module)
        # On an accelerator its allocator counts the step's peak for free; the CPU's would
        # need the profiler, which costs time (the multi-process runner profiles one step).
        ran = driver.run(batches, seeds, meter=peak_meter(device) if device.type != "cpu" else None)
        want, want_loss = reference_step(ref, batches, seeds, ref_specs, order)
        loss = sum_losses(ran["losses"])
        check = compare(ran["grads"], want, loss, want_loss, ran["buffers"], updated_buffers(ref.module, ref_buffers),
                        exact=True)
        steps.append({
            "step": step, **check, "loss": loss.item(), "reference_loss": want_loss.item(),
            "recomputes": ran["replays"], "saved_nothing": ran["saved_nothing"],
            "sessions_left": ran["sessions_left"], "step_time_s": ran["step_time_s"],
            "ranks": [{"rank": r, "peak_bytes": None} for r in range(plan.num_ranks)],
            "device_peak_bytes": ran["peak_bytes"], "counters": ran["counters"],
        })
        sgd_update(model.module, ran["grads"], driver.param_names)
        sgd_update(ref.module, want, driver.param_names)
    return {"mode": "single-process", "exact": True, "specs": specs, "steps": steps, "model_name": model.name,
            "device": str(device)}


# -- report ----------------------------------------------------------------------------------


def action_medians(steps: Iterable[Sequence[Sequence[Any]]]) -> List[Dict[str, Any]]:
    """Per (op, stage, plain forward): the median time of that action over ``steps`` (each the
    rank's ``(op, stage, plain, seconds)`` list), in us, and how many times it ran."""
    groups: Dict[Tuple[str, int, bool], List[float]] = {}
    for actions in steps:
        for op, stage, plain, seconds in actions:
            groups.setdefault((op, stage, bool(plain)), []).append(seconds * 1e6)
    return [{"op": op, "stage": stage, "plain": plain, "median_us": statistics.median(times), "count": len(times)}
            for (op, stage, plain), times in sorted(groups.items())]


def build_report(plan: Plan, args: argparse.Namespace, model_name: str, specs: Sequence[StageSpec],
                 result: Dict[str, Any]) -> Dict[str, Any]:
    """The report JSON (docs/runner.md lists every field)."""
    steps = result["steps"]
    n_steps = len(steps)
    sessions = len(plan.sessions) * n_steps
    check_recomputes = args.checkpoint_mode == "plan"
    # A region whose checkpoint saved no tensor has nothing to replay (hpr.exec.forward-handles).
    saved_nothing = sum(s["saved_nothing"] for s in steps)
    expected = expected_recomputes(plan) * n_steps - saved_nothing if check_recomputes else None
    recomputes = sum(s["recomputes"] for s in steps)
    grads_match = all(s["grads_match"] for s in steps)
    buffers_match = all(s["buffers_match"] for s in steps)
    sessions_left = max(s["sessions_left"] for s in steps)
    planned = plan.summary.get("peak_memory_bytes", [])
    planned_activations = plan.summary.get("peak_bytes", [])
    planned_busy = plan.summary.get("busy_us", [])
    timed = [s for s in steps if not s.get("profiled")] or steps
    ranks = []
    for r in range(plan.num_ranks):
        measured = max((s["ranks"][r]["peak_bytes"] for s in steps if s["ranks"][r]["peak_bytes"] is not None),
                       default=None)
        want = planned[r] if r < len(planned) else None
        entry = {"rank": r, "stages": [s for s in range(plan.num_stages) if plan.stage_to_rank[s] == r],
                 "measured_peak_bytes": measured, "planned_peak_bytes": want,
                 "planned_activation_peak_bytes": planned_activations[r] if r < len(planned_activations) else None,
                 "measured_over_planned": (measured / want) if want and measured is not None else None}
        if "step_time_s" in steps[0]["ranks"][r]:  # multi-process: each rank timed itself
            busy_us = statistics.median(s["ranks"][r]["busy_s"] for s in timed) * 1e6
            want_busy = planned_busy[r] if r < len(planned_busy) else None
            entry.update({"step_time_s": [s["ranks"][r]["step_time_s"] for s in steps],
                          "busy_us": busy_us, "planned_busy_us": want_busy,
                          "busy_over_planned": busy_us / want_busy if want_busy else None,
                          "measured_action_us": action_medians(s["ranks"][r]["action_s"] for s in timed)})
        ranks.append(entry)
    ok = grads_match and buffers_match and sessions_left == 0 and (not check_recomputes or recomputes == expected)
    times = [s["step_time_s"] for s in steps]
    # The step that measured memory ran under the profiler: time the others when there are any.
    planned_us = plan.summary.get("step_time_us")
    median_s = statistics.median(s["step_time_s"] for s in timed)
    return {
        "format": REPORT_FORMAT, "version": 2, "ok": ok,
        "plan": os.path.abspath(plan.path), "model": model_name, "mode": result["mode"],
        "checkpoint_mode": args.checkpoint_mode, "world_size": plan.num_ranks, "steps": n_steps, "seed": args.seed,
        "torch": torch.__version__, "threads_per_rank": args.threads,
        "schedule": {"name": plan.name, "num_ranks": plan.num_ranks, "num_stages": plan.num_stages,
                     "num_microbatches": plan.num_microbatches},
        "stages": {str(k): v for k, v in stage_names(specs).items()},
        "grads_match": grads_match, "buffers_match": buffers_match,
        "comparison": "torch.equal" if result["exact"] else "allclose(rtol=1e-5, atol=1e-6)",
        "max_abs_diff": max(s["max_abs_diff"] for s in steps),
        "mismatched": [m for s in steps for m in s["mismatched"]][:5],
        "loss": steps[-1]["loss"], "reference_loss": steps[-1]["reference_loss"],
        "sessions": sessions, "recomputes": recomputes, "recomputes_expected": expected,
        "regions_saving_nothing": saved_nothing,
        "plan_recomputes": plan.summary.get("recomputes"),
        "plan_per_backward_recomputes": plan.summary.get("per_backward_recomputes"),
        "sessions_left": sessions_left,
        "counters": {k: sum(s["counters"].get(k, 0) for s in steps)
                     for k in ("session_replays", "plain_replays", "prefetches", "clears")},
        "step_time_s": times, "profiled_steps": [s["step"] for s in steps if s.get("profiled")],
        "median_step_time_s": median_s, "planned_step_time_us": planned_us,
        "measured_over_planned_step_time": (median_s * 1e6 / planned_us) if planned_us else None,
        "ranks": ranks, "error": None,
        "device": result.get("device", "cpu"),
        "device_peak_bytes": max((s["device_peak_bytes"] for s in steps if s.get("device_peak_bytes") is not None),
                                 default=None),
    }


def _check_files(args: argparse.Namespace) -> None:
    """Refuses a --report the run could not or must not write, before the run (NOTE [ Output
    files ] in output_files.py): the plan and the model's file are inputs."""
    if args.report is None:
        return
    model_file = args.model.rpartition(":")[0] if args.model else DEFAULT_MODEL
    check_outputs([("--report", args.report)], [("--plan", args.plan), ("--model", model_file)])


def _write(path: Optional[str], report: Dict[str, Any]) -> None:
    """Writes the report (NOTE [ Output files ] in output_files.py); raises RunError."""
    if path is None:
        return
    try:
        write_outputs([("--report", path, text_writer(json.dumps(report, indent=2, default=str) + "\n"))])
    except OutputError as e:
        raise RunError(f"hp_recompute.run: {e}") from None


def _summary_lines(report: Dict[str, Any]) -> List[str]:
    lines = [f"hp_recompute.run: {report['schedule']['name']} {report['world_size']} ranks x "
             f"{report['schedule']['num_microbatches']} microbatches, {report['steps']} step(s), {report['mode']}"
             + (f" on {report['device']}" if report.get("device", "cpu") != "cpu" else "")
             + f", model {report['model']}, checkpoint {report['checkpoint_mode']}",
             f"grads_match {str(report['grads_match']).lower()} ({report['comparison']}, max_abs_diff "
             f"{report['max_abs_diff']:.3g}), loss {report['loss']:.6f}",
             f"sessions {report['sessions']}, recomputes {report['recomputes']} (expected "
             f"{report['recomputes_expected']}), sessions_left {report['sessions_left']}",
             f"step time median {report['median_step_time_s'] * 1000:.1f} ms" + (
                 " (only the profiled step 0: use --steps 2 or more to time)"
                 if len(report["profiled_steps"]) == report["steps"] else "") + (
                 f", simulated {report['planned_step_time_us'] / 1000:.1f} ms"
                 if report["planned_step_time_us"] else "")]
    if report.get("device_peak_bytes") is not None:
        lines.append(f"peak bytes at the {report['device']} allocator (all ranks): {report['device_peak_bytes']}")
    for r in report["ranks"]:
        if r["measured_peak_bytes"] is not None:
            busy = (f"; busy {r['busy_us'] / 1000:.1f} ms, simulated {r['planned_busy_us'] / 1000:.1f} ms"
                    if r.get("planned_busy_us") else "")
            lines.append(f"rank {r['rank']} stages {r['stages']}: peak bytes at the allocator "
                         f"{r['measured_peak_bytes']}, planned {r['planned_peak_bytes']}{busy}")
    lines.append("ok" if report["ok"] else "FAILED: " + ", ".join(
        m for m, bad in (("grads or buffers differ " + "; ".join(report["mismatched"]),
                          not (report["grads_match"] and report["buffers_match"])),
                         ("recomputes != expected", report["recomputes_expected"] is not None
                          and report["recomputes"] != report["recomputes_expected"]),
                         ("sessions left", report["sessions_left"] != 0)) if bad))
    return lines


def run(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """Runs the plan as ``args`` say and returns the report (raises ``RunError`` on failure).

    Under torchrun only rank 0 has the report; the other ranks return None."""
    plan = load_plan(args.plan)  # admitted: before any rank runs
    layout = plan.raw["model"].get("data_parallel")
    if layout is not None:
        raise RunError(f"hp_recompute.run: {plan.path}: /model/data_parallel: the plan is made for FSDP2 stages "
                       f"(shard {layout.get('shard', 1)}, replicate {layout.get('replicate', 1)}), and the runner has "
                       f"no data parallelism: its stages would run unsharded, outside the plan's step time and memory; "
                       f"run the plan with PlannedSchedule on fully_shard-ed stages (docs/fsdp.md), or plan without "
                       f"--dp-shard / --dp-replicate")
    if not plan.tagged and not args.single_process:
        raise RunError(f"hp_recompute.run: {plan.path}: the runner's processes match messages by tag, and this "
                       f"plan's transfers carry none; write the plan with hp-recompute-plan --emit json")
    from .torchrun import run_torchrun, torchrun_rank  # imports torch.distributed only when needed

    if torchrun_rank() is not None:
        if args.single_process or args.world_size is not None:
            raise RunError("hp_recompute.run: under torchrun the processes are torchrun's: drop "
                           "--single-process and --world-size (use torchrun --nproc-per-node)")
        result = run_torchrun(plan, args)
        if result is None:  # not rank 0: it reported to rank 0
            return None
        return build_report(plan, args, result["model_name"], result["specs"], result)
    world = args.world_size if args.world_size is not None else plan.num_ranks
    if world != plan.num_ranks:
        raise RunError(f"hp_recompute.run: --world-size {world} does not match the plan's {plan.num_ranks} ranks "
                       f"({args.plan}: /schedule/num_ranks)")
    if args.single_process:
        result = run_single(plan, args)
    else:
        from .multiprocess import run_multi  # imports torch.distributed only when needed
        result = run_multi(plan, args)
    return build_report(plan, args, result["model_name"], result["specs"], result)


def _failure_report(args: argparse.Namespace, e: RunError) -> Dict[str, Any]:
    """The report of a run that did not complete (docs/runner.md: ``error``, ``failed_rank``)."""
    failure = {"format": REPORT_FORMAT, "version": 1, "ok": False, "plan": args.plan,
               "error": str(e), "failed_rank": getattr(e, "rank", None)}
    if getattr(e, "ranks", None) is not None:  # multi-process: how each rank ended
        failure["rank_results"] = e.ranks  # type: ignore[attr-defined]
    return failure


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 1 check failed or error, 2 usage)."""
    args = _parse(argv)
    try:
        _check_files(args)
    except OutputError as e:
        print(f"hp_recompute.run: {e}", file=sys.stderr)
        return 2 if e.usage else 1
    try:
        report = run(args)
    except BaseException as e:  # noqa: BLE001 - any exception fails the run, SystemExit included
        error = e if isinstance(e, RunError) else RunError(f"hp_recompute.run: the run failed: {raised_at(e)}")
        print(str(error), file=sys.stderr)
        try:
            _write(args.report, _failure_report(args, error))
        except RunError as write_error:
            print(str(write_error), file=sys.stderr)
        return 1
    if report is None:
        return 0
    try:
        _write(args.report, report)
    except RunError as e:
        print(str(e), file=sys.stderr)
        return 1
    out = sys.stdout if report["ok"] and args.report != STDOUT else sys.stderr
    for line in _summary_lines(report) if not args.quiet or not report["ok"] else []:
        print(line, file=out)
    return 0 if report["ok"] else 1
