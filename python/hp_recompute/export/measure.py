"""Measure what each region of an eager model costs (used by ``hp_recompute.export``).

Why a separate module: the exporter's byte counts are the ground truth the C++
importer's saved-bytes rules are tested against, so the measurement is kept
small and independent of the TorchScript graph: it runs the *eager* model once
and observes autograd (``torch.autograd.graph.saved_tensors_hooks``) and the
dispatcher (``TorchDispatchMode``).

FLOPs are not restated here: each dispatched op is priced by the importers' own
op table (``lib/Model/RegionCosts.cpp``) through the planner extension
(``hp_recompute._planner.op_flops``, which names a dispatched kernel such as
``aten._softmax.default`` by its op, ``aten::softmax``), so a model exported as
``.pt2`` and read by the planner gets the FLOPs the sidecar has. An op the table
has no rule for is counted 0 with a warning, as the importers do; which ops are
views (they open no segment, below) is the same table's answer.

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

import warnings

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..plan.verify import planner_extension
from ..storage import storage_of

__all__ = ["Segment", "region_of", "measure_regions"]


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


class _Tracker:
    """Holds the module stack and the segments while the eager forward runs."""

    def __init__(self, depth: int, param_storages: Dict[int, int]) -> None:
        self.planner = planner_extension()
        self.views: Dict[str, bool] = {}  # op name -> is a view (the planner's table)
        self.unpriced: Dict[str, int] = {}  # op kind without a FLOP rule -> its first segment
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
        """Books dispatched op ``name`` (``aten.mm.default``) on positional ``args`` giving ``out``."""
        flat_in = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
        flat_out = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        view = self.views.get(name)
        if view is None:
            view = self.views[name] = self.planner.is_view_op(name)
        if view and self.segments and not self.stack:
            seg = self.segments[-1]  # a bare view outside modules opens no segment
        else:
            seg = self.current()
        index = len(self.segments) - 1  # seg is always the last segment
        flops = self.planner.op_flops(name, args, flat_out)
        if flops is None:  # no rule: 0, and one warning per op (after the run: the name is known)
            self.unpriced.setdefault(self.planner.op_kind(name), index)
            flops = 0.0
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
        self.tracker.on_op(str(func), list(args) + list((kwargs or {}).values()), out)
        return out


def _shapes(value: object) -> List[List[int]]:
    return [list(t.shape) for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def measure_regions(model: nn.Module, inputs: Tuple[torch.Tensor, ...],
                    depth: int = 1) -> List[Segment]:
    """Runs ``model(*inputs)`` once with autograd on and returns its segments in order.

    ``saved`` holds the distinct storages autograd saved for backward (parameters
    and buffers excluded), ``inputs``/``params`` the distinct storages each segment
    read that an earlier segment (or the caller) produced / that are parameters;
    ``flops`` the planner's FLOPs of its ops (module doc). An op without a FLOP rule
    is a ``UserWarning`` naming it and its region, once per op. Raises
    ``RunError`` (``hp_recompute.plan.reader``) when the planner extension is missing.
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
    for kind, index in tracker.unpriced.items():
        warnings.warn(f"hp_recompute: no FLOP rule for '{kind}' (in region "
                      f"'{tracker.segments[index].name}'); counted as 0 FLOPs, as hp-recompute-plan "
                      f"counts it", stacklevel=2)
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
