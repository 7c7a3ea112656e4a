"""What a replay must see again: RNG streams, autocast settings, the device context.

A replay must compute bit-identical tensors to the forward (dropout included) and must
not disturb the caller: a prefetch runs in the middle of a schedule, and the next
forward must draw the same random numbers as without the prefetch. See NOTE
[ Recompute sessions ] Rule 2 in ``checkpoint.py``.

Which device's state is kept follows the installed torch's checkpoint, through its own
helpers where it has them: the device type is inferred from the positional tensor
arguments (CUDA first, else the first non-CPU type, else torch's default device type,
``torch.accelerator`` on torch >= 2.6), RNG state is kept for the devices of those
arguments once that device type is initialised, autocast for that device type and for
the CPU, and the ``torch.device(...)`` context manager that was active in the forward.
torch 1.13 knows CPU and CUDA only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint as _torch_checkpoint

try:  # torch >= 2.0: ``with torch.device(...)`` is a function mode on a stack
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
except ImportError:  # torch 1.13
    _get_current_function_mode_stack = None

__all__ = ["ForwardState"]

# torch >= 2.1: device-generic helpers; torch 1.13: CUDA-only helpers without a device type.
_DEVICE_GENERIC = hasattr(_torch_checkpoint, "_infer_device_type")


def _infer_device_type(args: Sequence[Any]) -> str:
    if _DEVICE_GENERIC:
        return _torch_checkpoint._infer_device_type(*args)
    return "cuda"  # torch 1.13's checkpoint only knows CUDA besides the CPU


def _device_module(device_type: str) -> Any:
    """``torch.cuda``, ``torch.xpu``, ...; None where there is no such module (cpu, meta)."""
    module = getattr(torch, device_type, None)
    return module if hasattr(module, "get_rng_state") else None


def _initialized(module: Any) -> bool:
    # Never initialise a device by accident: only look at one that somebody else has.
    return bool(getattr(module, "_initialized", False)) if module is not None else False


def _autocast_kwargs(device_type: str) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """(device autocast kwargs or None, CPU autocast kwargs), as torch's checkpoint takes them."""
    if _DEVICE_GENERIC:
        return _torch_checkpoint._get_autocast_kwargs(device_type=device_type)
    gpu, cpu = _torch_checkpoint._get_autocast_kwargs()
    return (gpu if torch.cuda.is_available() else None), cpu


def _device_context() -> Any:
    """The innermost ``torch.device(...)`` context of the forward (torch >= 2.0), else None."""
    if _get_current_function_mode_stack is None:
        return None
    modes = [m for m in _get_current_function_mode_stack() if isinstance(m, DeviceContext)]
    return modes[-1] if modes else None


class ForwardState:
    """Snapshot taken at checkpoint forward time and re-established for each replay.

    Args:
        args: the checkpoint's positional arguments (their devices decide which device
            RNG streams are saved, as in ``torch.utils.checkpoint``).
        preserve_rng_state: save and restore RNG streams; off means a replay
            draws fresh random numbers (cheaper, not bit-identical with dropout).
    """

    __slots__ = (
        "device_type",
        "cpu_rng",
        "rng_devices",
        "device_rng",
        "had_device",
        "device_autocast",
        "cpu_autocast",
        "device_ctx",
    )

    def __init__(self, args: Sequence[Any], preserve_rng_state: bool) -> None:
        self.device_type = _infer_device_type(args)
        self.had_device = _initialized(_device_module(self.device_type))
        self.cpu_rng: Optional[torch.Tensor] = None
        self.rng_devices: List[int] = []
        self.device_rng: List[torch.Tensor] = []
        if preserve_rng_state:
            self.cpu_rng = torch.get_rng_state()
            if self.had_device:
                self.rng_devices, self.device_rng = _torch_checkpoint.get_device_states(*args)
        self.device_autocast, self.cpu_autocast = _autocast_kwargs(self.device_type)
        self.device_ctx = _device_context()

    def device_initialized_since(self) -> bool:
        """Whether the forward initialised the device whose RNG state could not be saved."""
        return self.cpu_rng is not None and not self.had_device and _initialized(_device_module(self.device_type))

    def _fork_rng(self) -> Any:
        """Saves the caller's RNG streams and puts them back afterwards (Rule 2)."""
        if _DEVICE_GENERIC:
            return torch.random.fork_rng(devices=self.rng_devices, device_type=self.device_type)
        return torch.random.fork_rng(devices=self.rng_devices)

    def _set_device_rng(self) -> None:
        if _DEVICE_GENERIC:
            _torch_checkpoint.set_device_states(self.rng_devices, self.device_rng, device_type=self.device_type)
        else:
            _torch_checkpoint.set_device_states(self.rng_devices, self.device_rng)

    @contextlib.contextmanager
    def restored(self):
        """Run the body under the forward's RNG/autocast/device state; restore the caller's RNG after."""
        with contextlib.ExitStack() as stack:
            if self.cpu_rng is not None:
                stack.enter_context(self._fork_rng())
                torch.set_rng_state(self.cpu_rng)
                if self.rng_devices:
                    self._set_device_rng()
            if self.device_autocast is not None:
                stack.enter_context(torch.autocast(self.device_type, **self.device_autocast))
            stack.enter_context(torch.autocast("cpu", **self.cpu_autocast))
            if self.device_ctx is not None:
                stack.enter_context(self.device_ctx)
            yield
