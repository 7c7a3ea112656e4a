#!/usr/bin/env python3
"""Benchmark the eager recompute sessions against torch's checkpoint and no checkpoint.

One pipeline stage of N checkpointed blocks runs M microbatches in a zero-bubble-like
order (all forwards, then I0, I1 W0, I2 W1, ..., W(M-1): dx and dw are separate autograd
calls). Variants, measured side by side in one run:

  none           no checkpoint
  native         torch.utils.checkpoint.checkpoint(use_reentrant=False)
  native-group   native, dx and dw of a microbatch under one GraphExecGroup (torch >= 2.10)
  ours-plain     hp_recompute.checkpoint outside any session (must equal native)
  ours-session   hp_recompute with a session per microbatch: prefetch right before dx,
                 dx with retain_on_unpack=True, dw, clear

Columns: block function calls per step, median step time, peak live bytes during a step
(allocator events of the legacy autograd profiler, relative to the step start), and
ratios against native. A second table times the unpack hot path: reading an already
recomputed saved tensor (``grad_fn._saved_self``) through each variant's hook.

Usage: bench/eager/run.sh (both torches), or python3 bench/eager/bench_eager.py [--blocks 8] [--microbatches 4] [--reps 7]
       [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.utils.checkpoint as torch_cp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import hp_recompute as hr  # noqa: E402

VARIANTS = ("none", "native", "native-group", "ours-plain", "ours-session")
HAS_GROUP = hasattr(torch_cp, "GraphExecGroup")


class Block(torch.nn.Module):
    """A transformer-MLP-like block: Linear -> GELU -> Linear with residual and LayerNorm."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Counter:
    """Counts calls of the wrapped block (forward calls and replays alike)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.module(x)


def forwards(variant: str, blocks: List[Counter], inputs: List[torch.Tensor]):
    """The forwards of all microbatches: (inputs requiring grad, losses, checkpoint handles) per microbatch."""
    xs, losses, handles = [], [], []
    for mb in range(len(inputs)):
        x = inputs[mb].detach().requires_grad_()
        with hr.recompute_handle_collector_ctx() as hs:
            h = x
            for block in blocks:
                if variant == "none":
                    h = block(h)
                elif variant in ("native", "native-group"):
                    h = torch_cp.checkpoint(block, h, use_reentrant=False)
                else:
                    h = hr.checkpoint(block, h)
        xs.append(x)
        losses.append(h.pow(2).mean())
        handles.append(hs)
    return xs, losses, handles


def run_step(variant: str, blocks: List[Counter], inputs: List[torch.Tensor], params) -> None:
    """One step of the stage: forwards of all microbatches, then I/W in zero-bubble order."""
    m = len(inputs)
    xs, losses, handles = forwards(variant, blocks, inputs)
    # One group per microbatch, entered for its dx and again for its dw: torch's way to
    # ask for one replay shared by several backward calls.
    groups = [torch_cp.GraphExecGroup() for _ in range(m)] if variant == "native-group" else None

    def grad(mb: int, *args, **kwargs):
        with groups[mb] if groups is not None else contextlib.nullcontext():
            return torch.autograd.grad(*args, **kwargs)

    def dx(mb: int) -> None:
        if variant == "ours-session":
            for handle in handles[mb]:
                hr.recompute_handle(handle, mb)
            with hr.recompute_session_ctx(mb, retain_on_unpack=True):
                torch.autograd.grad(losses[mb], [xs[mb]], retain_graph=True)
        else:
            grad(mb, losses[mb], [xs[mb]], retain_graph=True)

    def dw(mb: int) -> None:
        if variant == "ours-session":
            with hr.recompute_session_ctx(mb):
                torch.autograd.grad(losses[mb], params)
            hr.clear_recompute_session(mb)
        else:
            grad(mb, losses[mb], params)
        losses[mb] = None  # the graph dies here

    dx(0)
    for mb in range(1, m):
        dx(mb)
        dw(mb - 1)
    dw(m - 1)


def peak_bytes(step: Callable[[], None]) -> Optional[int]:
    """Peak of live allocated bytes during ``step`` relative to its start, from profiler memory events."""
    try:
        with torch.autograd.profiler.profile(profile_memory=True, use_kineto=False) as prof:
            step()
    except (RuntimeError, TypeError, AssertionError):
        return None
    events = sorted(prof.function_events, key=lambda e: e.time_range.start)
    live = peak = 0
    for event in events:
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def bench_steps(args) -> List[Dict[str, object]]:
    torch.manual_seed(0)
    modules = [Block(args.dim, args.hidden) for _ in range(args.blocks)]
    params = [p for m in modules for p in m.parameters()]
    inputs = [torch.randn(args.batch, args.dim) for _ in range(args.microbatches)]
    rows = []
    calls: Dict[str, int] = {}
    failed: Dict[str, str] = {}
    if not HAS_GROUP:
        failed["native-group"] = f"n/a: torch {torch.__version__} has no GraphExecGroup"
    for variant in VARIANTS:  # warm-up and call count
        if variant in failed:
            continue
        blocks = [Counter(m) for m in modules]
        try:
            run_step(variant, blocks, inputs, params)
        except RuntimeError as e:  # torch refuses the program (GraphExecGroup and overlapping dx/dw)
            failed[variant] = "fails: " + str(e).split(". ")[0].replace("torch.utils.checkpoint: ", "")
            continue
        calls[variant] = sum(b.calls for b in blocks)
    measured = [v for v in VARIANTS if v not in failed]
    times: Dict[str, List[float]] = {v: [] for v in measured}
    for _ in range(args.reps):  # interleave variants so drift hits all of them alike
        for variant in measured:
            blocks = [Counter(m) for m in modules]
            start = time.perf_counter()
            run_step(variant, blocks, inputs, params)
            times[variant].append(time.perf_counter() - start)
    for variant in VARIANTS:
        if variant in failed:
            rows.append({"variant": variant, "failed": failed[variant]})
            continue
        blocks = [Counter(m) for m in modules]
        peak = peak_bytes(lambda: run_step(variant, blocks, inputs, params))
        rows.append(
            {"variant": variant, "calls": calls[variant], "ms": 1e3 * statistics.median(times[variant]), "peak": peak}
        )
    assert hr.live_sessions() == [], "the benchmark leaked a session"
    return rows


def _chain(t: torch.Tensor, ops: int) -> torch.Tensor:
    for _ in range(ops):
        t = t.sin()
    return t


def _nodes(output: torch.Tensor, ops: int) -> list:
    nodes, node = [], output.grad_fn
    for _ in range(ops):
        nodes.append(node)
        node = node.next_functions[0][0]
    return nodes


def bench_unpack(args) -> Dict[str, Optional[float]]:
    """Nanoseconds per read of an already recomputed saved tensor, per variant (best of rounds)."""
    ops, reps, rounds = args.unpack_ops, args.unpack_reps, 5
    x = torch.randn(16, requires_grad=True)
    per_graph_task = hasattr(torch._C, "_current_graph_task_id")
    nodes: Dict[str, Optional[list]] = {"none": _nodes(_chain(x, ops), ops)}
    # torch 2.x drops each replayed tensor when read outside a session: no hot path to time.
    nodes["native"] = None if per_graph_task else _nodes(
        torch_cp.checkpoint(lambda t: _chain(t, ops), x, use_reentrant=False), ops
    )
    nodes["ours-plain"] = None if per_graph_task else _nodes(hr.checkpoint(lambda t: _chain(t, ops), x), ops)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(lambda t: _chain(t, ops), x)
    hr.recompute_handle(handles[0], "unpack")
    nodes["ours-session"] = _nodes(y, ops)
    best: Dict[str, float] = {}

    def session_for(variant: str):
        # Only the session variant reads inside its context; plain frames would bind to it.
        if variant == "ours-session":
            return hr.recompute_session_ctx("unpack", retain_on_unpack=True)
        return contextlib.nullcontext()

    for variant, ns in nodes.items():
        if ns is not None:
            with session_for(variant):
                for node in ns:  # the first read replays; later reads are the hot path
                    node._saved_self
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):  # interleaved, so machine noise hits every variant alike
            for variant, ns in nodes.items():
                if ns is None:
                    continue
                with session_for(variant):
                    start = time.perf_counter()
                    for _ in range(reps):
                        for node in ns:
                            node._saved_self
                    elapsed = 1e9 * (time.perf_counter() - start) / (reps * ops)
                best[variant] = min(best.get(variant, elapsed), elapsed)
    finally:
        gc.enable()
    assert hr.session_stats("unpack")["replays"] == 1, "the session variant replayed more than once"
    hr.clear_recompute_session("unpack")
    return {variant: best.get(variant) for variant in nodes}


def _fmt_bytes(n: Optional[int]) -> str:
    return "n/a" if n is None else f"{n / 2**20:.2f} MiB"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--unpack-ops", type=int, default=64)
    parser.add_argument("--unpack-reps", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (same for every torch)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"python {platform.python_version()}, threads {torch.get_num_threads()}"
    )
    print(
        f"stage: {args.blocks} blocks (dim {args.dim}, hidden {args.hidden}), {args.microbatches} microbatches "
        f"of batch {args.batch}, order F* I0 (I1 W0) ... W{args.microbatches - 1}, median of {args.reps}"
    )
    rows = bench_steps(args)
    native = next(r for r in rows if r["variant"] == "native")
    print()
    print("| variant | block calls | step time | peak live bytes | calls vs native | time vs native | peak vs native |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "failed" in r:
            print(f"| {r['variant']} | {r['failed']} | | | | | |")
            continue
        print(
            f"| {r['variant']} | {r['calls']} | {r['ms']:.1f} ms | {_fmt_bytes(r['peak'])} | "
            f"{_ratio(r['calls'], native['calls'])} | {_ratio(r['ms'], native['ms'])} | "
            f"{_ratio(r['peak'], native['peak'])} |"
        )
    unpack = bench_unpack(args)
    print()
    print(f"unpack hot path ({args.unpack_ops} saved tensors x {args.unpack_reps} reads, best of 5 rounds, via grad_fn._saved_self):")
    print("| variant | ns per read | vs native | hook cost vs native (minus no-hook read) |")
    print("| --- | ---: | ---: | ---: |")
    base = unpack["none"]
    for variant in ("none", "native", "ours-plain", "ours-session"):
        value = unpack[variant]
        hook = None if value is None or base is None else value - base
        native_hook = None if unpack["native"] is None or base is None else unpack["native"] - base
        shown = "n/a" if value is None else f"{value:.0f}"
        print(
            f"| {variant} | {shown} | {_ratio(value, unpack['native'])} | "
            f"{'-' if variant == 'none' else _ratio(hook, native_hook)} |"
        )


if __name__ == "__main__":
    main()
