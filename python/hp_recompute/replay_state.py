"""What a replay must see again: RNG streams, autocast settings, current CUDA device.

A replay must compute bit-identical tensors to the forward (dropout included) and must
not disturb the caller: a prefetch runs in the middle of a schedule, and the next
forward must draw the same random numbers as without the prefetch. See NOTE
[ Recompute sessions ] Rule 2 in ``checkpoint.py``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, List, Optional, Tuple

import torch

__all__ = ["ForwardState"]

# torch >= 2.4 takes the device type; older versions have per-device functions.
_HAS_DEVICE_AUTOCAST_API = hasattr(torch, "get_autocast_dtype")


def _autocast_settings(device_type: str) -> Tuple[bool, torch.dtype]:
    """Return (enabled, dtype) of autocast for ``device_type`` on this thread."""
    if _HAS_DEVICE_AUTOCAST_API:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    if device_type == "cpu":
        return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


def _cuda_devices(values: Iterable[Any]) -> List[int]:
    """CUDA devices of the tensor arguments: the RNG streams a replay may draw from."""
    return sorted({v.get_device() for v in values if isinstance(v, torch.Tensor) and v.is_cuda})


def _cuda_ready() -> bool:
    # Never initialise CUDA by accident: only look at it once somebody else has.
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class ForwardState:
    """Snapshot taken at checkpoint forward time and re-established for each replay.

    Args:
        inputs: the checkpoint's tensor arguments (their CUDA devices decide which
            CUDA RNG streams are saved, as in ``torch.utils.checkpoint``).
        preserve_rng_state: save and restore RNG streams; off means a replay
            draws fresh random numbers (cheaper, not bit-identical with dropout).
    """

    __slots__ = ("cpu_rng", "cuda_rng", "autocast", "autocast_cache", "cuda_device")

    def __init__(self, inputs: Iterable[Any], preserve_rng_state: bool) -> None:
        cuda = _cuda_ready()
        self.cpu_rng: Optional[torch.Tensor] = None
        self.cuda_rng: List[Tuple[int, torch.Tensor]] = []
        if preserve_rng_state:
            self.cpu_rng = torch.get_rng_state()
            if cuda:
                self.cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in _cuda_devices(inputs)]
        device_types = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
        self.autocast = tuple((d,) + _autocast_settings(d) for d in device_types)
        self.autocast_cache = torch.is_autocast_cache_enabled()
        self.cuda_device: Optional[int] = torch.cuda.current_device() if cuda else None

    @contextlib.contextmanager
    def restored(self):
        """Run the body under the forward's RNG/autocast/device state; restore the caller's RNG after."""
        with contextlib.ExitStack() as stack:
            if self.cuda_device is not None:
                stack.enter_context(torch.cuda.device(self.cuda_device))
            for device_type, enabled, dtype in self.autocast:
                stack.enter_context(
                    torch.autocast(device_type, enabled=enabled, dtype=dtype, cache_enabled=self.autocast_cache)
                )
            if self.cpu_rng is None:
                yield
                return
            caller_cpu = torch.get_rng_state()
            caller_cuda = [(d, torch.cuda.get_rng_state(d)) for d, _ in self.cuda_rng]
            torch.set_rng_state(self.cpu_rng)
            for device, state in self.cuda_rng:
                torch.cuda.set_rng_state(state, device)
            try:
                yield
            finally:
                torch.set_rng_state(caller_cpu)
                for device, state in caller_cuda:
                    torch.cuda.set_rng_state(state, device)
