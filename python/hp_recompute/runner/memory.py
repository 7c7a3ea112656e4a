"""Peak memory of a rank's step, measured at the allocator.

Why the profiler: the planner predicts each rank's peak from its cost model, so the
runner must measure it without that model. Every CPU allocation and free goes through
c10's allocator, which reports it to the profiler as a ``[memory]`` event with a signed
size when ``profile_memory=True``. Summing those in time order gives the bytes allocated
since the step began; its maximum is the peak: saved activations, replayed tensors,
stage outputs, received buffers, gradients and transient workspace alike. The profiler
costs time, so the runner measures memory on one step and times the others.

Two frees the profiler does not report. A block freed on a thread the profiler does not
follow (gloo's workers drop the last reference to FSDP's all-gather output and to their
own buffers) has no free event: its address is allocated again with no free between,
so the walk frees it there (at the latest; the peak may still read high by the blocks
freed so and not yet reused). A block allocated while no profiler ran has no recorded
size, so its free is not reported either ("Memory block of unknown size was allocated
before the profiling started"): a window that frees blocks allocated before it (a step
whose ``zero_grad(set_to_none=True)`` drops the previous step's gradients) reads high
by them, unless those were allocated under an earlier ``AllocatorPeak`` (the allocator
keeps the sizes it learnt): measure a step that follows a measured one.

On an accelerator the device's caching allocator keeps the same count itself
(``memory_allocated`` / ``max_memory_allocated``), at no cost: ``DeviceAllocatorPeak``
reads it through ``torch.accelerator`` where present, else the device module
(``torch.get_device_module``). ``peak_meter(device)`` picks one of the two by device.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from ..replay_state import device_module

__all__ = ["AllocatorPeak", "DeviceAllocatorPeak", "allocated_peak", "peak_meter"]

MEMORY_EVENT = "[memory]"


def _allocations(prof: torch.autograd.profiler.profile) -> List[Tuple[int, int, int]]:
    """Every allocation and free of the profiled window as ``(time ns, address, signed bytes)``,
    in time order (the event tree's ``[memory]`` leaves, which carry the address)."""
    found: List[Tuple[int, int, int]] = []
    pending = list(prof.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        if event.name == MEMORY_EVENT:
            found.append((event.start_time_ns, event.extra_fields.ptr, event.extra_fields.alloc_size))
        pending.extend(event.children)
    return sorted(found)


def allocated_peak(allocations: Iterable[Tuple[int, int, int]]) -> Tuple[int, int]:
    """``(peak, net)`` bytes of ``(time, address, signed bytes)`` allocator events in time order;
    an address allocated again with no free between was freed unseen, just before."""
    live = peak = 0
    blocks: Dict[int, int] = {}  # address -> bytes of a block allocated in the window, not freed yet
    for _, address, size in allocations:
        if size > 0 and address in blocks:  # freed on a thread the profiler does not follow
            live -= blocks.pop(address)
        if size > 0:
            blocks[address] = size
        else:
            blocks.pop(address, None)
        live += size
        peak = max(peak, live)
    return peak, live


class AllocatorPeak:
    """Context manager: ``peak`` is the most bytes allocated above the level at entry,
    ``net`` the bytes still allocated at exit (negative when more was freed)."""

    def __init__(self) -> None:
        self.peak: Optional[int] = None
        self.net: Optional[int] = None
        self._prof: Optional[torch.autograd.profiler.profile] = None

    def __enter__(self) -> "AllocatorPeak":
        # A profiler started inside another ends the outer one's memory accounting when it stops:
        # the outer window's later allocations get no size, so their frees go unseen and its
        # peak reads high. Refused, not measured wrong.
        if torch._C._autograd._profiler_enabled():
            raise RuntimeError("hp_recompute: AllocatorPeak: a profiler is already running; measure outside it "
                               "(a profiler started inside another stops the outer one's allocator accounting)")
        # Kineto prints a line on stderr at every start and stop unless told to be quiet.
        os.environ.setdefault("KINETO_LOG_LEVEL", "10")
        # torch.autograd.profiler.profile, the recorder under torch.profiler.profile: the latter's
        # start imports torch._inductor (torch 2.13, to read a CUDA-graphs setting), seconds
        # of CPU in each fresh rank or costs process, for nothing on the CPU.
        self._prof = torch.autograd.profiler.profile(use_cpu=True, use_kineto=True, profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._prof is not None
        self._prof.__exit__(*exc)
        if exc[0] is not None:
            return
        self.peak, self.net = allocated_peak(_allocations(self._prof))
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
