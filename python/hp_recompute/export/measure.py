"""Measure what each region of an eager model costs (used by ``hp_recompute.export``).

Why a separate module: the exporter's numbers are the ground truth the C++
importer's per-op rules are tested against, so the measurement is kept small
and independent of the TorchScript graph: it runs the *eager* model once and
observes autograd (``torch.autograd.graph.saved_tensors_hooks``) and the
dispatcher (``TorchDispatchMode``).

Region rule (mirrors the C++ importer, see docs/models.md): with the stack of
currently running submodules (outermost first), the region is the first path
that ends in an integer component and has exactly ``depth`` integer components
(``blocks.3`` at depth 1); at depth 0 it is the outermost called submodule.
Work outside every region forms non-checkpointable regions named after the
top-level submodules it calls (``tok_emb``, ``ln_f+head``), or ``top``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..storage import storage_of

__all__ = ["Segment", "region_of", "measure_regions", "op_flops"]


def region_of(stack: Sequence[str], depth: int) -> Optional[str]:
    """Returns the region a call stack of module paths is in, or None (see module doc)."""
    if depth == 0:
        return stack[0] if stack else None
    for path in stack:
        parts = path.split(".")
        if parts[-1].isdigit() and sum(p.isdigit() for p in parts) == depth:
            return path
    return None


@dataclass
class Segment:
    """One region (checkpointable) or one run of code outside regions."""

    name: str
    checkpointable: bool
    saved: Dict[int, int] = field(default_factory=dict)  # storage ptr -> bytes
    inputs: Dict[int, int] = field(default_factory=dict)
    params: Dict[int, int] = field(default_factory=dict)
    flops: float = 0.0
    callees: List[str] = field(default_factory=list)
    input_shapes: List[List[int]] = field(default_factory=list)
    output_shapes: List[List[int]] = field(default_factory=list)


# Ops that only move or reinterpret data: no FLOPs (docs/models.md, rule table).
_ZERO_FLOP = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute",
    "expand", "slice", "select", "split", "split_with_sizes", "chunk", "unsqueeze",
    "squeeze", "detach", "alias", "as_strided", "clone", "contiguous", "copy_",
    "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full",
    "arange", "lift_fresh", "lift_fresh_copy", "embedding", "index_select", "gather",
    "cat", "stack", "flatten", "unbind", "new_empty", "new_zeros", "fill_", "zero_",
    "_to_copy", "to", "scalar_tensor", "eq", "ne", "lt", "le", "gt", "ge", "tril", "triu",
}
# Pure views: outside regions they never open a segment of their own.
_VIEWS = {
    "view", "_unsafe_view", "_reshape_alias", "reshape", "t", "transpose", "permute",
    "expand", "slice", "select", "split", "split_with_sizes", "chunk", "unsqueeze",
    "squeeze", "detach", "alias", "as_strided", "flatten", "unbind",
}
# The kernels scaled_dot_product_attention dispatches to (the math fallback
# decomposes into bmm/softmax, which the rules above count).
_SDPA_KERNELS = {"_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention"}

_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "norm", "var", "std",
               "nll_loss_forward", "nll_loss", "nll_loss2d_forward", "logsumexp", "prod"}


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def op_flops(name: str, args: Sequence[object], out: object) -> float:
    """Forward FLOPs of one aten op as seen by the dispatcher (multiply-add = 2)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
    if name in ("mm", "addmm"):
        a, b = (args[0], args[1]) if name == "mm" else (args[1], args[2])
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    if name in ("bmm", "baddbmm"):
        a, b = (args[0], args[1]) if name == "bmm" else (args[1], args[2])
        return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    if name in _SDPA_KERNELS:
        # q @ k^T and attention @ v, as torch.utils.flop_counter's sdpa formula
        # counts them: q [.., L, E], k [.., S, E], v [.., S, Ev].
        q, k, v = args[0], args[1], args[2]
        rows = _numel(q.shape[:-1])
        return 2.0 * rows * k.shape[-2] * q.shape[-1] + 2.0 * rows * k.shape[-2] * v.shape[-1]
    if name == "mv":
        return 2.0 * args[0].shape[0] * args[0].shape[1]
    if name == "dot":
        return 2.0 * args[0].shape[0]
    if name in ("convolution", "_convolution", "mkldnn_convolution"):
        weight, groups = args[1], args[-1] if isinstance(args[-1], int) else 1
        kernel = _numel(weight.shape[2:])
        return 2.0 * outs[0].numel() * (weight.shape[1]) * kernel if groups else 0.0
    if name in _ZERO_FLOP or not outs:
        return 0.0
    if name in _REDUCTIONS and tensors:
        return float(tensors[0].numel())
    return float(outs[0].numel())


class _Tracker:
    """Holds the module stack and the segments while the eager forward runs."""

    def __init__(self, depth: int, param_storages: Dict[int, int]) -> None:
        self.depth = depth
        self.stack: List[str] = []
        self.segments: List[Segment] = []
        self.param_storages = param_storages
        self.producer: Dict[int, int] = {}  # storage ptr -> segment index
        self.keep: List[torch.Tensor] = []  # keeps storages alive: no address reuse

    def current(self) -> Segment:
        """The segment the running code belongs to, opened on demand."""
        region = region_of(self.stack, self.depth)
        last = self.segments[-1] if self.segments else None
        if region is not None:
            if last is None or not last.checkpointable or last.name != region:
                self.segments.append(Segment(region, True))
        elif last is None or last.checkpointable:
            self.segments.append(Segment("", False))
        seg = self.segments[-1]
        if not seg.checkpointable and self.stack and self.stack[0] not in seg.callees:
            seg.callees.append(self.stack[0])
        return seg

    def on_saved(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = storage_of(tensor)
        ptr = storage.data_ptr()
        if ptr not in self.param_storages:
            self.current().saved[ptr] = storage.nbytes()
        self.keep.append(tensor)
        return tensor

    def on_op(self, name: str, args: Sequence[object], out: object) -> None:
        flops = op_flops(name, args, out)
        flat_in = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
        flat_out = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if name in _VIEWS and self.segments and not self.stack:
            seg = self.segments[-1]  # a bare view outside modules opens no segment
        else:
            seg = self.current()
        index = len(self.segments) - 1  # seg is always the last segment
        seg.flops += flops
        for t in flat_in:
            storage = storage_of(t)
            ptr = storage.data_ptr()
            if ptr in self.param_storages:
                seg.params[ptr] = storage.nbytes()
            elif self.producer.get(ptr, -1) != index:
                seg.inputs[ptr] = storage.nbytes()
        for t in flat_out:
            ptr = storage_of(t).data_ptr()
            self.producer.setdefault(ptr, index)
            self.keep.append(t)


class _OpMode(TorchDispatchMode):
    """Reports every aten op to the tracker."""

    def __init__(self, tracker: _Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.tracker.on_op(name, list(args) + list((kwargs or {}).values()), out)
        return out


def _shapes(value: object) -> List[List[int]]:
    return [list(t.shape) for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def measure_regions(model: nn.Module, inputs: Tuple[torch.Tensor, ...],
                    depth: int = 1) -> List[Segment]:
    """Runs ``model(*inputs)`` once with autograd on and returns its segments in order.

    ``saved`` holds the distinct storages autograd saved for backward (parameters
    and buffers excluded), ``inputs``/``params`` the distinct storages each segment
    read that an earlier segment (or the caller) produced / that are parameters.
    """
    param_storages = {storage_of(p).data_ptr(): storage_of(p).nbytes()
                      for p in list(model.parameters()) + list(model.buffers())}
    tracker = _Tracker(depth, param_storages)
    names = {m: n for n, m in model.named_modules() if n}
    handles = []

    def pre_hook(module: nn.Module, args: object) -> None:
        tracker.stack.append(names[module])
        region = region_of(tracker.stack, depth)
        if region == names[module]:
            tracker.current().input_shapes = _shapes(args)

    def post_hook(module: nn.Module, args: object, out: object) -> None:
        if region_of(tracker.stack, depth) == names[module]:
            tracker.current().output_shapes = _shapes(out)
        tracker.stack.pop()

    for module in names:
        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(post_hook))
    try:
        with torch.autograd.graph.saved_tensors_hooks(tracker.on_saved, lambda t: t):
            with _OpMode(tracker):
                model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    _name_outside(tracker.segments)
    return tracker.segments


def _name_outside(segments: List[Segment]) -> None:
    """Names outside segments after the top-level modules they call, uniquely."""
    used = {s.name for s in segments if s.checkpointable}
    for seg in segments:
        if seg.checkpointable:
            continue
        base = "+".join(seg.callees) if seg.callees else "top"
        name, k = base, 2
        while name in used:
            name, k = f"{base}.{k}", k + 1
        seg.name = name
        used.add(name)
