"""What a replay must see again: RNG streams, autocast settings, the device context.

A replay must compute bit-identical tensors to the forward (dropout included) and must not
disturb the caller: a prefetch runs in the middle of a schedule, and the next forward must
draw the same random numbers as without the prefetch (hpr.session.faithful-replay,
hpr.session.any-device; NOTE [ Recompute sessions ] in ``checkpoint.py``).

Which device's state is kept follows the installed torch's checkpoint, through its own
helpers where it has them: the device type is inferred from the positional tensor
arguments (CUDA first, else the first non-CPU type, else torch's default device type,
``torch.accelerator`` on torch >= 2.6), RNG state is kept for the devices of those
arguments once that device type is initialised, autocast for that device type and for
the CPU, and the ``torch.device(...)`` context manager that was active in the forward.
torch 1.13 knows CPU and CUDA only.

Where a replay runs (hpr.session.side-stream): on the caller's current stream, or on a stream the
caller passes to ``recompute_handle``. The stream helpers below look devices up through
torch's generic APIs (``torch.accelerator`` where present, else
``torch.get_device_module`` / ``torch.<type>``), never by naming CUDA; the frame calls
them through this module, so a test can stand in for a device with streams on a CPU
machine.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint as _torch_checkpoint

from .errors import CheckpointError, error_text

try:  # torch >= 2.0: ``with torch.device(...)`` is a function mode on a stack
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
except ImportError:  # torch 1.13
    _get_current_function_mode_stack = None

__all__ = [
    "ForwardState",
    "device_module",
    "has_streams",
    "stream_device",
    "check_stream",
    "current_stream",
    "on_stream",
    "record_stream",
]

# torch >= 2.1: device-generic helpers; torch 1.13: CUDA-only helpers without a device type.
_DEVICE_GENERIC = hasattr(_torch_checkpoint, "_infer_device_type")


def _infer_device_type(args: Sequence[Any]) -> str:
    if _DEVICE_GENERIC:
        return _torch_checkpoint._infer_device_type(*args)
    return "cuda"  # torch 1.13's checkpoint only knows CUDA besides the CPU


def device_module(device_type: str) -> Any:
    """``torch.cuda``, ``torch.xpu``, ``torch.cpu``, ...; None where torch has none (meta).

    ``torch.get_device_module`` (torch >= 2.3) also finds out-of-tree backends registered
    under their own name; older torch has the module as an attribute of ``torch``.
    """
    lookup = getattr(torch, "get_device_module", None)
    if lookup is not None:
        try:
            return lookup(device_type)
        except (RuntimeError, ValueError, AttributeError):  # no module registered for the type
            return None
    return getattr(torch, device_type, None)


def _rng_module(device_type: str) -> Any:
    """The device module when it keeps RNG state of its own (not the CPU's), else None."""
    module = device_module(device_type)
    return module if hasattr(module, "get_rng_state") else None


def _initialized(module: Any) -> bool:
    # Never initialise a device by accident: only look at one that somebody else has.
    if module is None:
        return False
    probe = getattr(module, "is_initialized", None)
    if callable(probe):
        return bool(probe())
    return bool(getattr(module, "_initialized", False))


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
        self.had_device = _initialized(_rng_module(self.device_type))
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
        return self.cpu_rng is not None and not self.had_device and _initialized(_rng_module(self.device_type))

    def _fork_rng(self) -> Any:
        """Saves the caller's RNG streams and puts them back afterwards (hpr.session.faithful-replay)."""
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


# -- streams (hpr.session.side-stream) ---------------------------------------------------------


def synchronize(device: torch.device) -> None:
    """Waits for the work queued on ``device``: ``torch.accelerator`` where present, else its
    device module; nothing to wait for on the CPU."""
    if device.type == "cpu":
        return
    sync = getattr(getattr(torch, "accelerator", None), "synchronize", None)
    if sync is not None:
        sync(device)
    else:
        device_module(device.type).synchronize(device)


def has_streams(device_type: str) -> bool:
    """Whether tensors of ``device_type`` run on streams a replay can be put on.

    torch >= 2.6 answers generically: the device type of the current accelerator
    (``torch.accelerator.current_accelerator()``; never the CPU, whose ``torch.cpu.Stream``
    only exists so that device-generic code runs). Older torch: a device module with
    ``Stream`` and ``current_stream`` other than the CPU's.
    """
    accelerator = getattr(getattr(torch, "accelerator", None), "current_accelerator", None)
    if accelerator is not None:
        current = accelerator()
        return current is not None and current.type == device_type
    module = device_module(device_type)
    return device_type != "cpu" and hasattr(module, "Stream") and hasattr(module, "current_stream")


def stream_device(stream: Any) -> Optional[torch.device]:
    """The device of a stream object (``torch.Stream``, ``torch.cuda.Stream``, ...), else None."""
    device = getattr(stream, "device", None)
    if not all(hasattr(stream, name) for name in ("record_event", "wait_event", "wait_stream")):
        return None
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    return None


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def check_stream(stream: Any, devices: Sequence[torch.device], where: str) -> torch.device:
    """The device of ``stream``, checked against the devices of a checkpoint's inputs (hpr.session.side-stream).

    Args:
        stream: what the caller passed (not None).
        devices: the devices of the checkpoint's tensor inputs (empty: unknown).
        where: the call, for messages.

    Raises:
        CheckpointError: the checkpoint runs on devices without streams (the CPU), the
            stream belongs to such a device, or to another device than the checkpoint's.
        ValueError: ``stream`` is not a stream.
    """
    if devices and not any(has_streams(d.type) for d in devices):
        kinds = ", ".join(sorted({str(d) for d in devices}))
        raise CheckpointError(
            error_text(
                f"{where}: the checkpoint's inputs are on {kinds}, which has no streams, so stream={stream!r} "
                "cannot be honoured; pass stream=None (the replay then runs at once, on the calling thread)"
            )
        )
    device = stream_device(stream)
    if device is None:
        raise ValueError(
            error_text(
                f"{where}: stream must be None or a stream of the checkpoint's device (e.g. torch.cuda.Stream() or "
                f"torch.Stream('cuda')), got {type(stream).__name__}"
            )
        )
    if not has_streams(device.type):
        raise CheckpointError(
            error_text(
                f"{where}: stream {stream!r} is a stream of {device}, which has no streams a replay could run on; "
                "pass stream=None, or a stream of the accelerator the checkpoint runs on"
            )
        )
    if devices and not any(_same_device(device, d) for d in devices):
        kinds = ", ".join(sorted({str(d) for d in devices}))
        raise CheckpointError(
            error_text(
                f"{where}: stream {stream!r} is on {device} but the checkpoint's inputs are on {kinds}; pass a stream "
                "of the device the checkpoint runs on (e.g. torch.cuda.Stream(device=x.device))"
            )
        )
    return device


def current_stream(device: torch.device) -> Any:
    """The current stream of ``device`` on this thread (in a backward: the node's stream)."""
    accelerator = getattr(torch, "accelerator", None)
    current = getattr(accelerator, "current_stream", None)
    if current is not None and has_streams(device.type):
        return current(device)
    return device_module(device.type).current_stream(device)


@contextlib.contextmanager
def on_stream(stream: Any) -> Iterator[None]:
    """Makes ``stream`` current for the body (and its device current), then restores both.

    Through the device module's stream context (``torch.cuda.stream``, ``torch.xpu.stream``),
    else ``torch.accelerator.set_stream``, which switches the device index too.
    """
    device = stream_device(stream)
    assert device is not None
    context = getattr(device_module(device.type), "stream", None)
    if context is not None:
        with context(stream):
            yield
        return
    accelerator = torch.accelerator  # torch >= 2.7 when there is no module context
    index = accelerator.current_device_index()
    previous = accelerator.current_stream(device)
    accelerator.set_stream(stream)
    try:
        yield
    finally:
        accelerator.set_stream(previous)
        accelerator.set_device_index(index)


def record_stream(tensor: torch.Tensor, stream: Any) -> None:
    """Tells the caching allocator that ``stream`` uses ``tensor``: its memory is reused only
    after the work ``stream`` has queued by then is done."""
    tensor.record_stream(stream)
