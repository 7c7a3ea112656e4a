#!/usr/bin/env python3
"""A prefetch on a side stream overlapping other work, shown in a profiler trace.

Microbatch A's forward runs through checkpointed blocks (its handles collected); then
A is prefetched into a session while the caller's stream runs microbatch B's forward
through the same blocks. Two ways, each timed (median, device synchronised):

  same stream   recompute_handle(h, "A")                 then B's forward
  side stream   recompute_handle(h, "A", stream=side)    then B's forward

After each, A's dx and dw consume the session (checked: one replay per block, and the
gradients of both ways are bit-identical) and the session is cleared. One side-stream
round runs under ``torch.profiler`` (CPU and, on a device, its kernels); its Chrome
trace is written to ``OUT/overlap-trace.json``, and the time during which kernels of two
or more streams run at once is read back from that trace (0 means no overlap). On the
CPU there are no streams: both ways run on the calling thread and the trace has no
kernels (the dry run checks that the case runs and the trace is written and read).

Usage: python3 bench/gpu/overlap.py --device cuda --out DIR [--dim 4096] [--blocks 4]
       [--batch 4096] [--reps 5] [--row-file ROWS]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "eager"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import bench_eager  # noqa: E402  (bench/eager: Block)
import hp_recompute as hr  # noqa: E402
from hp_recompute.replay_state import device_module, has_streams  # noqa: E402

from eager_device import synchronize  # noqa: E402
from rows import add_row  # noqa: E402


def concurrent_kernel_us(trace: Any) -> Tuple[int, Dict[Any, float], float]:
    """From a Chrome trace: (kernel count, busy us per stream, us during which kernels of
    two or more streams run at the same time)."""
    edges: List[Tuple[float, int, Any]] = []
    busy: Dict[Any, float] = {}
    kernels = 0
    events = trace if isinstance(trace, list) else trace.get("traceEvents", [])  # torch 1.13: a bare list
    for e in events:
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        stream = (e.get("args") or {}).get("stream", e.get("tid"))
        start, dur = float(e["ts"]), float(e["dur"])
        kernels += 1
        busy[stream] = busy.get(stream, 0.0) + dur
        edges += [(start, 1, stream), (start + dur, -1, stream)]
    edges.sort(key=lambda t: (t[0], t[1]))  # ends before starts at the same instant
    running: Dict[Any, int] = {}
    overlap, last = 0.0, None
    for t, step, stream in edges:
        if last is not None and sum(1 for n in running.values() if n > 0) >= 2:
            overlap += t - last
        running[stream] = running.get(stream, 0) + step
        last = t
    return kernels, busy, overlap


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True, help="folder of the trace (overlap-trace.json)")
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--row-file", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    blocks = [bench_eager.Block(args.dim, 4 * args.dim).to(device) for _ in range(args.blocks)]
    params = [q for b in blocks for q in b.parameters()]
    x_a = torch.randn(args.batch, args.dim, device=device, requires_grad=True)
    x_b = torch.randn(args.batch, args.dim, device=device)
    side = device_module(device.type).Stream() if has_streams(device.type) else None
    calls = [0]

    def counted(block: Any) -> Any:
        def run(h: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return block(h)
        run.__qualname__ = "block"
        return run

    with hr.recompute_handle_collector_ctx() as handles:
        h = x_a
        for b in blocks:
            h = hr.checkpoint(counted(b), h)
        loss_a = h.pow(2).mean()
    scope = hr.SessionScope("bench/gpu overlap")

    def round_trip(stream: Any) -> Tuple[float, List[torch.Tensor]]:
        """Prefetch A (on ``stream``), B's forward, then A's dx and dw; returns (seconds of the
        prefetch + B's forward, A's gradients)."""
        calls[0] = 0
        synchronize(device)
        start = time.perf_counter()
        with torch.profiler.record_function("prefetch A"):
            for handle in handles:
                scope.recompute_handle(handle, "A", stream=stream)
        with torch.profiler.record_function("forward B"), torch.no_grad():
            y = x_b
            for b in blocks:
                y = b(y)
        synchronize(device)
        elapsed = time.perf_counter() - start
        with scope.recompute_session_ctx("A", retain_on_unpack=True):
            (dx,) = torch.autograd.grad(loss_a, [x_a], retain_graph=True)
        with scope.recompute_session_ctx("A"):
            dw = torch.autograd.grad(loss_a, params, retain_graph=True)
        scope.clear_recompute_session("A")
        assert calls[0] == len(blocks), f"{calls[0]} replays for {len(blocks)} blocks"
        return elapsed, [dx, *dw]

    _, want = round_trip(None)  # warm-up, reference gradients
    _, got = round_trip(side)
    same = all(torch.equal(a, b) for a, b in zip(got, want))
    times: Dict[str, List[float]] = {"same": [], "side": []}
    for _ in range(args.reps):
        times["same"].append(round_trip(None)[0])
        times["side"].append(round_trip(side)[0])
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    os.makedirs(args.out, exist_ok=True)
    trace_path = os.path.join(args.out, "overlap-trace.json")
    os.environ.setdefault("KINETO_LOG_LEVEL", "10")
    with torch.profiler.profile(activities=activities) as prof:
        round_trip(side)
    prof.export_chrome_trace(trace_path)
    with open(trace_path, encoding="utf-8") as f:
        kernels, busy, overlap = concurrent_kernel_us(json.load(f))
    same_ms = 1e3 * statistics.median(times["same"])
    side_ms = 1e3 * statistics.median(times["side"])
    streams = "side stream" if side is not None else "stream=None (no streams on cpu)"
    details = (f"prefetch A + forward B: same stream {same_ms:.2f} ms, {streams} {side_ms:.2f} ms; trace: {kernels} "
               f"kernels on {len(busy)} streams, {overlap / 1e3:.2f} ms with 2+ streams busy; grads "
               f"{'bit-identical' if same else 'DIFFER'}; {os.path.basename(trace_path)}")
    print(f"overlap on {device}: {details}")
    ok = same and scope.live_sessions() == []
    add_row(args.row_file, f"side-stream prefetch overlap ({device.type})", "ok" if ok else "FAILED", details)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
