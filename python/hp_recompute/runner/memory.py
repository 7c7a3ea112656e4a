"""Peak memory of a rank's step, measured at the allocator.

Why the profiler: the planner predicts each rank's peak from its cost model, so the
runner must measure it without that model. Every CPU allocation and free goes through
c10's allocator, which reports it to the profiler as a ``[memory]`` event with a signed
size when ``profile_memory=True``. Summing those in time order gives the bytes allocated
since the step began; its maximum is the peak: saved activations, replayed tensors,
stage outputs, received buffers, gradients and transient workspace alike. The profiler
costs time, so the runner measures memory on one step and times the others.

On an accelerator the device's caching allocator keeps the same count itself
(``memory_allocated`` / ``max_memory_allocated``), at no cost: ``DeviceAllocatorPeak``
reads it through ``torch.accelerator`` where present, else the device module
(``torch.get_device_module``). ``peak_meter(device)`` picks one of the two by device.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Union

import torch
from torch.profiler import ProfilerActivity, profile

from ..replay_state import device_module

__all__ = ["AllocatorPeak", "DeviceAllocatorPeak", "peak_meter"]

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


def _allocator_stats(device: torch.device) -> Optional[Callable[[str], Callable[..., Any]]]:
    """Looks up the allocator statistics of ``device``: ``torch.accelerator``'s functions when
    ``device`` is the current accelerator (torch >= 2.9 has them), else its device module's;
    None when neither counts allocations (the CPU, a backend without statistics)."""
    names = ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats")
    accelerator = getattr(torch, "accelerator", None)
    current = getattr(accelerator, "current_accelerator", None)
    sources = []
    if current is not None and current() is not None and current().type == device.type:
        sources.append(accelerator)
    sources.append(device_module(device.type))
    for source in sources:
        if source is not None and all(callable(getattr(source, n, None)) for n in names):
            return lambda name, source=source: getattr(source, name)
    return None


class DeviceAllocatorPeak:
    """Context manager over an accelerator's caching allocator: ``peak`` is the most bytes
    allocated on ``device`` above the level at entry, ``net`` the bytes still allocated at
    exit (negative when more was freed). Host-side counts: no synchronisation needed.

    Resets the device's peak statistic at entry (``reset_peak_memory_stats``).
    """

    def __init__(self, device: Union[str, torch.device]) -> None:
        self.device = torch.device(device)
        stats = _allocator_stats(self.device)
        if stats is None:
            raise RuntimeError(f"hp_recompute: {self.device} has no allocator statistics (memory_allocated, "
                               "max_memory_allocated, reset_peak_memory_stats); measure on the CPU (profiler) "
                               "or on an accelerator whose torch backend counts allocations")
        self._stat = stats
        self.peak: Optional[int] = None
        self.net: Optional[int] = None
        self._base = 0

    def __enter__(self) -> "DeviceAllocatorPeak":
        self._base = self._stat("memory_allocated")(self.device)
        self._stat("reset_peak_memory_stats")(self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:
            return
        self.peak = self._stat("max_memory_allocated")(self.device) - self._base
        self.net = self._stat("memory_allocated")(self.device) - self._base


def peak_meter(device: Union[None, str, torch.device] = None) -> Union[AllocatorPeak, DeviceAllocatorPeak]:
    """The peak-memory context manager for ``device`` (default: the CPU).

    The CPU is measured by the profiler's memory events (``AllocatorPeak``), an
    accelerator by its allocator (``DeviceAllocatorPeak``, which refuses a device whose
    allocator keeps no statistics). Both expose ``peak`` and ``net`` after the block.

    Example:
        >>> with peak_meter(x.device) as meter:
        ...     step()
        >>> meter.peak
    """
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cpu":
        return AllocatorPeak()
    return DeviceAllocatorPeak(device)
