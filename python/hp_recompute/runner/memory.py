"""Peak memory of a rank's step, measured at the allocator.

Why the profiler: the planner predicts each rank's peak from its cost model, so the
runner must measure it without that model. Every CPU allocation and free goes through
c10's allocator, which reports it to the profiler as a ``[memory]`` event with a signed
size when ``profile_memory=True``. Summing those in time order gives the bytes allocated
since the step began; its maximum is the peak: saved activations, replayed tensors,
stage outputs, received buffers, gradients and transient workspace alike. The profiler
costs time, so the runner measures memory on one step and times the others.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["AllocatorPeak"]

MEMORY_EVENT = "[memory]"


def _start(event: Any) -> int:
    return event.start_ns() if hasattr(event, "start_ns") else event.start_us() * 1000  # torch 1.13: us


class AllocatorPeak:
    """Context manager: ``peak`` is the most bytes allocated above the level at entry,
    ``net`` the bytes still allocated at exit (negative when more was freed)."""

    def __init__(self) -> None:
        self.peak: Optional[int] = None
        self.net: Optional[int] = None
        self._prof: Optional[profile] = None

    def __enter__(self) -> "AllocatorPeak":
        # Kineto prints a line on stderr at every start and stop unless told to be quiet.
        os.environ.setdefault("KINETO_LOG_LEVEL", "10")
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._prof is not None
        self._prof.__exit__(*exc)
        if exc[0] is not None:
            return
        events = [e for e in self._prof.profiler.kineto_results.events() if e.name() == MEMORY_EVENT]
        live = peak = 0
        for event in sorted(events, key=_start):
            live += event.nbytes()
            peak = max(peak, live)
        self.peak, self.net = peak, live
        self._prof = None
