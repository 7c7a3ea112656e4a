"""Multi-process execution: one process per rank, gloo point-to-point, and failure handling.

Why: a plan's transfers and session lifetimes only meet reality across processes. The
parent hosts a ``TCPStore`` on 127.0.0.1 (free port), saves the initial weights, and
starts N ranks with ``torch.multiprocessing``, forked from a server that imported torch and
hp_recompute once (``processes.rank_start_method``). Each rank joins a gloo process
group through that store, runs its action list (``RankExecutor``) with ``isend``/``irecv``
(receives wait at most ``--timeout`` seconds), and writes its gradients, losses and
counters to a result file; the parent compares them with the reference step.

Failure handling (no rank may hang, every rank exits non-zero):

1. A rank that raises clears its sessions, writes its error, bumps the store counter
   ``hpr/failed`` (the first to do so is the *root* failure), stores its message, prints
   it and exits 1 at once.
2. Every rank runs a watchdog thread that polls that counter; when another rank failed
   it records ``aborted: rank R failed: ...`` and exits 2 (a peer blocked in a receive
   from the dead rank also gets gloo's "connection closed" error and takes path 1 as a
   secondary failure).
3. The parent polls its children; once one has failed it gives the rest a short grace
   period (``GRACE_S``), then ends every rank still there: SIGTERM, ``TERM_GRACE_S`` more,
   then SIGKILL (a stopped rank, SIGSTOP or a debugger, takes no SIGTERM), and reaps them
   all. It reports the root rank's error, and how the runner ended each rank it ended,
   and exits 1. No child outlives the run, also when the parent itself is interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from .reference import (buffer_snapshot, check_regions, compare, make_batches, microbatch_seeds, reference_step,
                        sgd_update, sum_losses, updated_buffers)
from .memory import AllocatorPeak
from .executor import Transport
from .model import load_model, split_stages
from .steps import StepDriver
from ..errors import RunError
from ..factory import raised_at
from ..plan.reader import Plan, build_plan
from ..processes import rank_start_method
from ..sessions import SessionScope

__all__ = ["GlooTransport", "run_multi"]

FAILED_KEY = "hpr/failed"
ERROR_KEY = "hpr/error"
ABORT_EXIT = 2
#: Seconds the other ranks get to end on their own after the first failure (failure handling, point 3).
GRACE_S = 5.0
#: Seconds a rank gets to end after SIGTERM before SIGKILL (failure handling, point 3).
TERM_GRACE_S = 1.0


class GlooTransport(Transport):
    """``isend``/``irecv`` on the default gloo group; receives wait at most ``timeout`` seconds.

    Each message carries the plan's tag (it encodes direction, sending stage and
    microbatch), so an out-of-order message can never be taken for another. A receive's
    ``irecv`` is issued where it is posted, into its own buffer, and waited for by
    ``recv``. Sends are waited for at ``flush`` (end of step): an early wait could
    deadlock a plan that relies on asynchronous sends. So a sent tensor is held to the end
    of the step (gloo reports a send complete only once it is waited for), as in torch's
    schedules, and the planner's memory model holds it so (docs/models.md, "Cost model").
    """

    def __init__(self, num_mb: int, shapes: Dict[int, Tuple[torch.Size, torch.dtype]], timeout: float) -> None:
        self.num_mb, self.shapes = num_mb, shapes
        self.timeout = datetime.timedelta(seconds=timeout)
        self.pending: List[Tuple[Any, torch.Tensor]] = []
        self.posted: Dict[Tuple[str, int, int], Tuple[Any, torch.Tensor]] = {}  # (kind, stage, mb) -> irecv

    def send(self, kind: str, stage: int, mb: int, src: int, dst: int, tensor: torch.Tensor, tag: int) -> None:
        if tag < 0:
            raise RunError(f"hp_recompute.run: the send_{kind} of stage {stage} mb {mb} has no message tag; "
                           f"write the plan with hp-recompute-plan --emit json")
        tensor = tensor.detach().contiguous()
        self.pending.append((dist.isend(tensor, dst, tag=tag), tensor))

    def post(self, kind: str, stage: int, mb: int, src: int, dst: int, tag: int) -> None:
        # The activation of stage s and the gradient w.r.t. it have the same shape.
        shape, dtype = self.shapes[stage if kind == "f" else stage - 1]
        buf = torch.empty(shape, dtype=dtype)
        self.posted[(kind, stage, mb)] = (dist.irecv(buf, src, tag=tag), buf)

    def recv(self, kind: str, stage: int, mb: int, src: int, dst: int, tag: int) -> torch.Tensor:
        if (kind, stage, mb) not in self.posted:
            self.post(kind, stage, mb, src, dst, tag)
        work, buf = self.posted.pop((kind, stage, mb))
        try:
            work.wait(self.timeout)
        except RuntimeError as e:
            raise ConnectionError(f"receiving the {'activation' if kind == 'f' else 'gradient'} of stage {stage} "
                                  f"mb {mb} from rank {src} failed (timeout {self.timeout.total_seconds():g} s): "
                                  f"{str(e).strip()}") from None
        return buf

    def flush(self) -> None:
        for work, _ in self.pending:
            work.wait(self.timeout)
        self.pending.clear()


def _boundary_shapes(model: Any, specs: Any, batch: Any) -> Dict[int, Tuple[torch.Size, torch.dtype]]:
    """Output shape/dtype of every stage, from one no-grad forward (all microbatches agree)."""
    shapes = {}
    with torch.no_grad():
        x = batch
        for spec in specs:
            for unit in spec.units:
                x = unit(x, batch)
            shapes[spec.stage] = (x.shape, x.dtype)
    return shapes


def _watchdog(rank: int, port: int, timeout: float, state: Dict[str, Any], result_path: str) -> None:
    """Exits this rank (ABORT_EXIT) as soon as another rank reports a failure."""
    try:
        store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=timeout))
    except Exception:  # noqa: BLE001 - the parent is gone; nothing to watch
        return
    while not state.get("finished"):
        try:
            failed = store.add(FAILED_KEY, 0)
        except Exception:  # noqa: BLE001 - the store went away: the parent ended the run
            os._exit(ABORT_EXIT)
        if failed and not state.get("failing"):
            time.sleep(0.2)  # let the main thread report its own error if it has one
            if state.get("failing") or state.get("finished"):
                return
            try:
                message = store.get(ERROR_KEY).decode()
            except Exception:  # noqa: BLE001
                message = "another rank failed"
            text = f"hp_recompute.run: rank {rank} aborted: {message}"
            # Clearing is thread-safe (the control plane's lock, then a frame's lock), also while
            # the main thread waits in a receive or replays a frame: the clear waits for it.
            sessions: SessionScope = state["sessions"]
            sessions.clear_all()
            left = len(sessions.live_sessions())
            torch.save({"rank": rank, "error": text, "root": False, "sessions_left": left}, result_path)
            print(text, file=sys.stderr, flush=True)
            os._exit(ABORT_EXIT)
        time.sleep(0.05)


def run_rank_steps(rank: int, plan: Plan, model: Any, cfg: Dict[str, Any],
                   sessions: SessionScope) -> List[Dict[str, Any]]:
    """This rank's program for every step (the process group is up; ``StepDriver``), its recompute
    sessions in ``sessions``: per step its record (``StepDriver.run``), for ``compare_steps``."""
    specs = split_stages(plan, model)
    shapes = _boundary_shapes(model, specs, make_batches(model, cfg["seed"], 0, 1)[0])
    driver = StepDriver(plan, model, specs, GlooTransport(plan.num_microbatches, shapes, cfg["timeout"]), [rank],
                        cfg["mode"], {rank: sessions})
    steps = []
    for step in range(cfg["steps"]):
        seeds = microbatch_seeds(cfg["seed"], step, plan.num_microbatches)
        batches = make_batches(model, cfg["seed"], step, plan.num_microbatches)
        # memory.py: the CPU's peak needs the profiler, which costs time: one step is profiled
        ran = driver.run(batches, seeds, meter=AllocatorPeak() if step == 0 else None, barrier=dist.barrier)
        steps.append({**ran, "grads": {n: g.clone() for n, g in ran["grads"].items()}, "profiled": step == 0})
        sgd_update(model.module, ran["grads"], driver.param_names)
    return steps


def _worker(rank: int, cfg: Dict[str, Any]) -> None:
    """One rank: join the group, run every step, write ``rank{R}.pt``; never return on failure."""
    result_path = os.path.join(cfg["dir"], f"rank{rank}.pt")
    sessions = SessionScope(f"hp_recompute.run rank {rank}")
    state: Dict[str, Any] = {"sessions": sessions}  # the watchdog clears them on an abort
    store = None
    try:
        torch.set_num_threads(cfg["threads"])
        timeout = datetime.timedelta(seconds=cfg["timeout"])
        store = dist.TCPStore("127.0.0.1", cfg["port"], None, False, timeout)
        threading.Thread(target=_watchdog, args=(rank, cfg["port"], cfg["timeout"], state, result_path),
                         daemon=True).start()
        dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=cfg["world"], timeout=timeout)
        with open(os.path.join(cfg["dir"], "plan.json"), encoding="utf-8") as f:
            plan = build_plan(json.load(f), cfg["plan"])  # the parent admitted it
        model = load_model(cfg["model"], input_shape=cfg["input_shape"])
        model.module.load_state_dict(torch.load(os.path.join(cfg["dir"], "init.pt")))
        steps = run_rank_steps(rank, plan, model, cfg, sessions)
        dist.barrier()
        state["finished"] = True
        torch.save({"rank": rank, "steps": steps, "error": None}, result_path)
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        state["failing"] = True
        left = len(sessions.clear_all())
        text = str(e) if isinstance(e, RunError) else f"hp_recompute.run: rank {rank}: {raised_at(e)}"
        root = False
        if store is not None:
            try:
                root = store.add(FAILED_KEY, 1) == 1
                if root:
                    store.set(ERROR_KEY, f"rank {rank} failed: {text}")
            except Exception:  # noqa: BLE001
                pass
        torch.save({"rank": rank, "error": text, "root": root, "sessions_left": len(sessions.live_sessions()),
                    "cleared": left}, result_path)
        print(text, file=sys.stderr, flush=True)
        os._exit(1)


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, or a debugger): state T or t in /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _end_ranks(procs: List[Any]) -> Dict[int, str]:
    """Ends every rank still running (failure handling, point 3): SIGTERM, TERM_GRACE_S, SIGKILL, and reaps them.

    Returns:
        rank -> how the runner ended it, for the error message.
    """
    ended: Dict[int, str] = {}
    for rank, proc in enumerate(procs):
        if proc.exitcode is None:
            ended[rank] = "was stopped (SIGSTOP or a debugger)" if _stopped(proc.pid) else "was still running"
            proc.terminate()
    deadline = time.monotonic() + TERM_GRACE_S
    for rank in ended:
        procs[rank].join(max(0.0, deadline - time.monotonic()))
    for rank in ended:
        if procs[rank].exitcode is None:
            procs[rank].kill()  # SIGKILL also ends a stopped process
            ended[rank] += f": SIGTERM did not end it within {TERM_GRACE_S:g} s, the runner killed it (SIGKILL)"
        else:
            ended[rank] += ": the runner ended it (SIGTERM)"
    for rank in ended:
        procs[rank].join(TERM_GRACE_S)
    return ended


def _wait(procs: List[Any], port_store: Any, timeout: float) -> Dict[int, str]:
    """Waits for every rank; after the first failure, ends stragglers after a grace period.

    Returns:
        rank -> how the runner ended it (``_end_ranks``), for the ranks it ended.
    """
    failed_at = None
    while True:
        codes = [p.exitcode for p in procs]
        if all(c is not None for c in codes):
            return {}
        failed = any(c not in (None, 0) for c in codes)
        if not failed:
            try:
                failed = port_store.add(FAILED_KEY, 0) > 0
            except Exception:  # noqa: BLE001
                failed = True
        if failed and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > min(GRACE_S, timeout):
            return _end_ranks(procs)
        time.sleep(0.05)


def _how_it_ended(code: Optional[int], ended: Optional[str]) -> str:
    """A rank's end in words: the runner's doing, a signal, or its exit code."""
    if ended is not None:
        return ended
    if code is not None and code < 0:
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _sessions_left(result: Optional[Dict[str, Any]]) -> Optional[int]:
    """Sessions a rank left: from its error record, the max over its steps, or None (no result)."""
    if result is None:
        return None
    if "sessions_left" in result:
        return result["sessions_left"]
    return max((s["sessions_left"] for s in result.get("steps", [])), default=None)


def run_multi(plan: Plan, args: argparse.Namespace) -> Dict[str, Any]:
    """Spawns ``plan.num_ranks`` processes, runs, and compares with the reference step."""
    model = load_model(args.model, input_shape=args.input_shape)
    specs = split_stages(plan, model)
    check_regions(model, make_batches(model, args.seed, 0, 1)[0])
    with tempfile.TemporaryDirectory(prefix="hpr-run-") as folder:
        torch.save(model.module.state_dict(), os.path.join(folder, "init.pt"))
        # The ranks read the plan the parent read (also when it came from a pipe such as /dev/stdin).
        with open(os.path.join(folder, "plan.json"), "w", encoding="utf-8") as f:
            json.dump(plan.raw, f)
        store = dist.TCPStore("127.0.0.1", 0, plan.num_ranks + 1, True, datetime.timedelta(seconds=args.timeout),
                              wait_for_workers=False)
        cfg = {"dir": folder, "port": store.port, "world": plan.num_ranks, "plan": os.path.abspath(plan.path),
               "model": args.model, "input_shape": args.input_shape, "seed": args.seed, "steps": args.steps,
               "timeout": args.timeout,
               "mode": args.checkpoint_mode, "threads": args.threads}
        ctx = tmp.start_processes(_worker, args=(cfg,), nprocs=plan.num_ranks, join=False, start_method=rank_start_method())
        try:
            ended = _wait(ctx.processes, store, args.timeout)
        finally:  # also when this process is interrupted: no rank outlives the run
            _end_ranks(ctx.processes)
        codes = [p.exitcode for p in ctx.processes]
        results = {}
        for r in range(plan.num_ranks):
            path = os.path.join(folder, f"rank{r}.pt")
            results[r] = torch.load(path) if os.path.exists(path) else None
    if any(c != 0 for c in codes) or any(res is None or res.get("error") for res in results.values()):
        errors = {r: res for r, res in results.items() if res and res.get("error")}
        # A rank that died without a word (SIGKILL, the OOM killer) comes first: the others'
        # errors (a closed connection, an abort) follow from it.
        dead = [r for r, res in results.items() if res is None]
        root = next((r for r, res in errors.items() if res.get("root")), None)
        if dead:
            root = dead[0]
        elif root is None and errors:
            root = min(errors)
        lines = [f"hp_recompute.run: the run failed (exit codes {codes})"]
        for r in dead:
            lines.append(f"rank {r} {_how_it_ended(codes[r], ended.get(r))}; it left no result")
        if root is not None and root in errors:
            lines.append(f"rank {root} failed first: {errors[root]['error']}")
        for r in sorted(errors):
            if r != root:
                lines.append(f"rank {r}: {errors[r]['error']} (sessions left {errors[r].get('sessions_left')})")
        err = RunError("\n".join(lines))
        err.rank = root  # type: ignore[attr-defined]
        # Per rank, for the failure report: how it ended and what it left behind.
        ranks = [{"rank": r, "exit_code": codes[r], "error": res.get("error") if res else None,
                  "sessions_left": _sessions_left(res)} for r, res in results.items()]
        err.ranks = ranks  # type: ignore[attr-defined]
        raise err
    return compare_steps(plan, model, specs, results, args)


def compare_steps(plan: Plan, model: Any, specs: Any, results: Dict[int, Dict[str, Any]],
                  args: argparse.Namespace) -> Dict[str, Any]:
    """Every step of every rank against the reference step on ``model`` (at the initial weights)."""
    order = plan.weight_grad_order()
    names = [n for s in specs for n in s.params]
    steps = []
    for step in range(args.steps):
        grads: Dict[str, torch.Tensor] = {}
        losses: Dict[int, torch.Tensor] = {}
        buffers: Dict[str, torch.Tensor] = {}
        for r in range(plan.num_ranks):
            grads.update(results[r]["steps"][step]["grads"])
            losses.update(results[r]["steps"][step]["losses"])
            buffers.update(results[r]["steps"][step]["buffers"])
        seeds = microbatch_seeds(args.seed, step, plan.num_microbatches)
        batches = make_batches(model, args.seed, step, plan.num_microbatches)
        buffers_before = buffer_snapshot(model.module)
        want, want_loss = reference_step(model, batches, seeds, specs, order)
        check = compare(grads, want, sum_losses(losses), want_loss, buffers,
                        updated_buffers(model.module, buffers_before), exact=False)
        per = [results[r]["steps"][step] for r in range(plan.num_ranks)]
        counters = {k: sum(p["counters"][k] for p in per) for k in per[0]["counters"]}
        steps.append({"step": step, **check, "loss": sum_losses(losses).item(), "reference_loss": want_loss.item(),
                      "recomputes": sum(p["replays"] for p in per),
                      "saved_nothing": sum(p["saved_nothing"] for p in per),
                      "sessions_left": max(p["sessions_left"] for p in per),
                      "step_time_s": max(p["step_time_s"] for p in per), "profiled": per[0]["profiled"],
                      "ranks": [{"rank": r, "peak_bytes": p["peak_bytes"], "step_time_s": p["step_time_s"],
                                 "busy_s": p["busy_s"], "action_s": p["action_s"]} for r, p in enumerate(per)],
                      "counters": counters})
        sgd_update(model.module, want, names)
        for p in model.module.parameters():
            p.grad = None
    return {"mode": "multi-process", "exact": False, "specs": specs, "steps": steps, "model_name": model.name}
