#!/usr/bin/env python3
"""The eager bench (bench/eager/bench_eager.py) on one device, plus a side-stream variant.

One pipeline stage of N checkpointed blocks runs M microbatches in the zero-bubble-like
order of bench/eager (all forwards, then I0, (I1 W0), ..., W(M-1)); the stage, its
blocks and the step of each variant are bench/eager's own (imported, not copied). Here
they run on ``--device`` and are measured there:

  native        torch.utils.checkpoint.checkpoint(use_reentrant=False)
  ours-plain    hp_recompute.checkpoint outside any session (must replay as native)
  ours-session  one session per microbatch: prefetch right before dx, dx retained, dw, clear
  ours-side     as ours-session, but microbatch k+1 is prefetched on a side stream while
                dx(k) and dw(k-1) run on the caller's stream (the CPU has no streams:
                there the prefetch runs on the calling thread, stream=None)

Columns: replays per step (block calls minus forwards; checked: native and ours-plain
replay twice per block and microbatch on torch 2.x, the session variants once), median
step time (the device synchronised around each step), and the step's peak above its start
at the device allocator (``hp_recompute.runner.memory.peak_meter``: the profiler on the
CPU). Each variant is one row of bench/gpu/run.sh's table (``--row-file``).

Usage: python3 bench/gpu/eager_device.py --device cuda [--blocks 8] [--microbatches 4]
       [--dim 1024] [--hidden 4096] [--batch 2048] [--reps 5] [--row-file ROWS]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "eager"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import bench_eager  # noqa: E402  (bench/eager: Block, Counter, forwards, run_step)
import hp_recompute as hr  # noqa: E402
from hp_recompute.replay_state import device_module, has_streams, synchronize  # noqa: E402
from hp_recompute.runner.memory import peak_meter  # noqa: E402

from rows import add_row, fmt_bytes  # noqa: E402

VARIANTS = ("native", "ours-plain", "ours-session", "ours-side")


def side_step(blocks: List[Any], inputs: List[torch.Tensor], params: List[torch.Tensor], stream: Any) -> None:
    """ours-side: bench/eager's ours-session order, each microbatch prefetched one ahead on ``stream``."""
    m = len(inputs)
    xs, losses, handles = bench_eager.forwards("ours-session", blocks, inputs)

    def prefetch(mb: int) -> None:
        for handle in handles[mb]:
            hr.recompute_handle(handle, mb, stream=stream)

    def dw(mb: int) -> None:
        with hr.recompute_session_ctx(mb):
            torch.autograd.grad(losses[mb], params)
        hr.clear_recompute_session(mb)
        losses[mb] = None

    prefetch(0)
    for mb in range(m):
        if mb + 1 < m:
            prefetch(mb + 1)  # queued on the side stream: overlaps what follows
        with hr.recompute_session_ctx(mb, retain_on_unpack=True):
            torch.autograd.grad(losses[mb], [xs[mb]], retain_graph=True)
        if mb > 0:
            dw(mb - 1)
    dw(m - 1)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--row-file", default=None, help="append the table rows here (bench/gpu/run.sh)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    modules = [bench_eager.Block(args.dim, args.hidden).to(device) for _ in range(args.blocks)]
    params = [q for m in modules for q in m.parameters()]
    inputs = [torch.randn(args.batch, args.dim, device=device) for _ in range(args.microbatches)]
    stream = device_module(device.type).Stream() if has_streams(device.type) else None
    forwards = args.blocks * args.microbatches
    per_graph_task = hasattr(torch._C, "_current_graph_task_id")  # torch 2.x: native replays per backward

    def step(variant: str, blocks: List[Any]) -> None:
        if variant == "ours-side":
            side_step(blocks, inputs, params, stream)
        else:
            bench_eager.run_step(variant, blocks, inputs, params)

    plain = forwards * (2 if per_graph_task else 1)  # torch 1.13: one replay shared by dx and dw
    want_replays = {"native": plain, "ours-plain": plain, "ours-session": forwards, "ours-side": forwards}
    results: Dict[str, Dict[str, Any]] = {}
    for variant in VARIANTS:  # warm-up, replay count
        blocks = [bench_eager.Counter(m) for m in modules]
        step(variant, blocks)
        synchronize(device)
        results[variant] = {"replays": sum(b.calls for b in blocks) - forwards, "times": []}
    for _ in range(args.reps):  # interleaved, so drift hits every variant alike
        for variant in VARIANTS:
            blocks = [bench_eager.Counter(m) for m in modules]
            synchronize(device)
            start = time.perf_counter()
            step(variant, blocks)
            synchronize(device)
            results[variant]["times"].append(time.perf_counter() - start)
    for variant in VARIANTS:
        blocks = [bench_eager.Counter(m) for m in modules]
        synchronize(device)
        with peak_meter(device) as meter:
            step(variant, blocks)
            synchronize(device)
        results[variant]["peak"] = meter.peak
    assert hr.live_sessions() == [], "the bench leaked a session"
    ok_all = True
    native_ms = 1e3 * statistics.median(results["native"]["times"])
    where = "allocator" if device.type != "cpu" else "profiler"
    print(f"eager bench on {device}: {args.blocks} blocks (dim {args.dim}, hidden {args.hidden}), "
          f"{args.microbatches} microbatches of batch {args.batch}, median of {args.reps}, torch {torch.__version__}")
    for variant in VARIANTS:
        r = results[variant]
        ms = 1e3 * statistics.median(r["times"])
        ok = r["replays"] == want_replays[variant]
        ok_all = ok_all and ok
        stream_note = ""
        if variant == "ours-side":
            stream_note = ", side stream" if stream is not None else ", stream=None (no streams on cpu)"
        details = (f"replays {r['replays']} (want {want_replays[variant]}), step {ms:.2f} ms "
                   f"({ms / native_ms:.2f}x native), peak {fmt_bytes(r['peak'])} at the {where}{stream_note}")
        print(f"  {variant}: {details}")
        add_row(args.row_file, f"eager bench {variant} ({device.type})", "ok" if ok else "FAILED", details)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
