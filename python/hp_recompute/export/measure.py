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
has no rule for is counted 0 with a warning, as the importers do.

Regions are not restated either (docs/models.md, "Region rules"): while the
forward runs, each dispatched op is recorded with the module call stack it ran
in (and which of those modules were called before), and each measured fact
(an op's FLOPs and the storages it read and produced, a tensor autograd saved)
with the op it belongs to. After the forward the whole op list goes to
``hp_recompute._planner.segment_ops``, the importers' own segmentation
(``segmentOps`` in ``hpr/Model/Segments.h``): it says which segment each op is
in, names the segments, and refuses a region's module called twice or a depth
with no region, in the importers' words (a ``RegionError`` here). The facts are
then summed per segment.

What a region's dx keeps for its dw (``bwd_weight_input_bytes``) is read off the same run
(``Segment.weight_grads``): the dx/dw split (NOTE [ dx/dw split ], hpr.split.split-nodes)
records the gradient each split node receives, a node on the input path that also leads to a
trainable parameter, i.e. a non-view op that reads a parameter and a tensor on the input
path (one the region's input or such an op led to); it receives the gradient of each of its
outputs a later op reads. A region whose output is off the input path but needs a gradient
(a first region of embeddings: only parameters lead to it) seeds its dw from that output.
Of what the region saves, its dw reads what those ops saved (``Segment.weight_saved``): a
checkpointed region's replay keeps that after its dx and releases the rest
(hpr.split.release-unread), the region's ``replay_weight_bytes`` (its inputs aside: the
checkpoint keeps them, a replay allocates them not). ``python -m hp_recompute.costs``
measures both by running the split (test_export_sidecar.py holds the two to each other).

Chosen regions (``regions=``, ``python -m hp_recompute.costs --regions``) go through the
same function, which takes them for the regions instead of its depth rule and refuses a
path named twice, one inside another or one that runs no op; ``resolve_regions`` only
turns the user's spec into module paths (it needs the module tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import warnings

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..errors import HPRecomputeError
from ..native import planner_extension
from ..storage import storage_of

__all__ = ["RegionError", "Segment", "measure_regions", "resolve_regions"]


class RegionError(ValueError, HPRecomputeError):
    """The planner's segmentation refused the model's module calls (its message, unchanged)."""


@dataclass
class Segment:
    """One region (checkpointable) or one run of code outside regions."""

    name: str
    checkpointable: bool
    saved: Dict[int, int] = field(default_factory=dict)  # storage ptr -> bytes
    inputs: Dict[int, int] = field(default_factory=dict)
    params: Dict[int, int] = field(default_factory=dict)
    tied: Dict[str, int] = field(default_factory=dict)  # parameter FQN -> bytes, of params another reads
    flops: float = 0.0
    input_shapes: List[List[int]] = field(default_factory=list)
    output_shapes: List[List[int]] = field(default_factory=list)
    #: the last segment only: bytes of the model's outputs (distinct storages), which the
    #: loss outside the model reads (0 elsewhere: the next segment's input is its output)
    output_bytes: int = 0
    #: storage ptr -> bytes: the gradients its dx keeps for its dw (module doc)
    weight_grads: Dict[int, int] = field(default_factory=dict)
    #: storage ptr -> bytes: of what it saves, what its dw reads again (module doc)
    weight_saved: Dict[int, int] = field(default_factory=dict)


@dataclass
class _Op:
    """What one dispatched op did, recorded while it ran (its segment is known only later)."""

    name: str
    chain: Tuple[Tuple[str, ...], Tuple[str, ...]]  # (module paths, those called before)
    context: int  # module entries and exits before it (_Tracker.context)
    view: bool
    flops: float
    reads: List[Tuple[int, int, bool]]  # (storage ptr, bytes, is a parameter/buffer)
    writes: List[int]  # storage ptrs of its results
    reads_trainable: bool = False  # reads a parameter that requires a gradient
    grad_reads: List[int] = field(default_factory=list)  # storage ptrs of its non-parameter inputs needing one
    results: List[torch.Tensor] = field(default_factory=list)  # floating results (requires_grad is set after)


class _Tracker:
    """Records the module stack, the ops and the saved tensors while the eager forward runs."""

    def __init__(self, param_storages: Dict[int, int], trainable: Optional[Set[int]] = None) -> None:
        self.planner = planner_extension()
        self.views: Dict[str, bool] = {}  # op name -> is a view (the planner's table)
        self.unpriced: Dict[str, int] = {}  # op kind without a FLOP rule -> its first op
        self.stack: List[Tuple[str, bool]] = []  # (module path, called before)
        self.chain: Tuple[Tuple[str, ...], Tuple[str, ...]] = ((), ())
        self.context = 0
        self.calls: Dict[str, int] = {}  # module path -> calls so far
        self.shapes: Dict[str, List[List[List[int]]]] = {}  # path -> [inputs, outputs], 1st call
        self.ops: List[_Op] = []
        self.saves: List[Tuple[int, int, int, int]] = []  # (ops before, context, ptr, bytes)
        self.param_storages = param_storages
        self.trainable = trainable or set()  # storage ptrs of the parameters that require grad
        self.outputs: Set[int] = set()  # storage ptrs of the model's outputs (measure_regions)
        self.keep: List[torch.Tensor] = []  # keeps storages alive: no address reuse

    def _moved(self) -> None:
        self.context += 1
        self.chain = (tuple(p for p, _ in self.stack), tuple(p for p, again in self.stack if again))

    def enter(self, path: str, args: object) -> None:
        calls = self.calls[path] = self.calls.get(path, 0) + 1
        if calls == 1:
            self.shapes[path] = [_shapes(args), []]
        self.stack.append((path, calls > 1))
        self._moved()

    def leave(self, path: str, out: object) -> None:
        if self.calls[path] == 1:
            self.shapes[path][1] = _shapes(out)
        self.stack.pop()
        self._moved()

    def on_saved(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = storage_of(tensor)
        ptr = storage.data_ptr()
        if ptr not in self.param_storages:
            self.saves.append((len(self.ops), self.context, ptr, storage.nbytes()))
        self.keep.append(tensor)
        return tensor

    def on_op(self, name: str, args: Sequence[object], out: object) -> None:
        """Records dispatched op ``name`` (``aten.mm.default``) on positional ``args`` giving ``out``."""
        flat_in = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
        flat_out = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        view = self.views.get(name)
        if view is None:
            view = self.views[name] = self.planner.is_view_op(name)
        flops = self.planner.op_flops(name, args, flat_out)
        if flops is None:  # no rule: 0, and one warning per op (after the run: the name is known)
            self.unpriced.setdefault(self.planner.op_kind(name), len(self.ops))
            flops = 0.0
        reads = []
        reads_trainable = False
        grad_reads = []
        for t in flat_in:
            storage = storage_of(t)
            ptr = storage.data_ptr()
            reads.append((ptr, storage.nbytes(), ptr in self.param_storages))
            reads_trainable |= ptr in self.trainable
            if ptr not in self.param_storages and t.is_floating_point() and t.requires_grad:
                grad_reads.append(ptr)
        writes = []
        for t in flat_out:
            writes.append(storage_of(t).data_ptr())
            self.keep.append(t)
        results = [t for t in flat_out if t.is_floating_point()]
        self.ops.append(_Op(name, self.chain, self.context, view, flops, reads, writes, reads_trainable,
                            grad_reads, results))

    def save_owner(self, before: int, context: int) -> Optional[int]:
        """The op a tensor saved after ``before`` ops, in module context ``context``, is saved for.

        Autograd saves an op's inputs before the op dispatches and its results after, both
        within the op's module call: the next op if it ran in that call (and is no view, which
        saves nothing), else the previous one.
        """
        following = before if before < len(self.ops) and self.ops[before].context == context else None
        previous = before - 1 if before > 0 and self.ops[before - 1].context == context else None
        if following is not None and not self.ops[following].view:
            return following
        for index in (previous, following, before - 1 if before > 0 else None):
            if index is not None:
                return index
        return before if before < len(self.ops) else None

    def segments(self, name: str, depth: int, regions: Sequence[str] = ()) -> List[Segment]:
        """Asks the planner for the segments of the recorded ops and sums each one's facts."""
        ops = [(op.name,) + op.chain for op in self.ops]
        try:
            segment_of, described = self.planner.segment_ops(name, ops, depth, list(regions))
        except ValueError as e:
            raise RegionError(str(e)) from None
        segments = [Segment(seg_name, checkpointable) for seg_name, checkpointable in described]
        for seg in segments:
            if seg.checkpointable and seg.name in self.shapes:
                seg.input_shapes, seg.output_shapes = self.shapes[seg.name]
        saves: List[List[Tuple[int, int]]] = [[] for _ in self.ops]
        for before, context, ptr, nbytes in self.saves:
            owner = self.save_owner(before, context)
            if owner is not None:
                saves[owner].append((ptr, nbytes))
        producer: Dict[int, int] = {}  # storage ptr -> segment index
        for op, index, saved in zip(self.ops, segment_of, saves):
            seg = segments[index]
            seg.flops += op.flops
            for ptr, nbytes in saved:
                seg.saved[ptr] = nbytes
            for ptr, nbytes, is_param in op.reads:
                if is_param:
                    seg.params[ptr] = nbytes
                elif producer.get(ptr, -1) != index:
                    seg.inputs[ptr] = nbytes
            for ptr in op.writes:
                producer.setdefault(ptr, index)
        self._weight_grads(segments, segment_of, producer, saves)
        if self.unpriced:  # one warning for all of them, each op named once
            ops = ", ".join(f"'{kind}' (first in region '{segments[segment_of[first]].name}')"
                            for kind, first in self.unpriced.items())
            warnings.warn(f"hp_recompute: no FLOP rule for {ops}; counted as 0 FLOPs, as hp-recompute-plan "
                          f"counts them", stacklevel=3)
        return segments


    def _weight_grads(self, segments: List[Segment], segment_of: Sequence[int], producer: Dict[int, int],
                      saves: Sequence[Sequence[Tuple[int, int]]]) -> None:
        """Fills each segment's ``weight_grads`` (module doc): the outputs of its split ops a
        later op reads (or the model returns), and its off-path outputs that need a gradient;
        and its ``weight_saved``: what the ops that read a trainable parameter saved, which the
        dw reads (its region's inputs aside: a checkpoint keeps them)."""
        read_after: Dict[int, int] = {}  # storage ptr -> the last op reading it
        readers: Dict[int, Set[int]] = {}  # storage ptr -> the segments reading it
        for position, (op, index) in enumerate(zip(self.ops, segment_of)):
            for ptr, _, _ in op.reads:
                read_after[ptr] = position
                readers.setdefault(ptr, set()).add(index)
        on_path: Set[int] = set()  # storages on the input path of the segment that made them
        for position, (op, index) in enumerate(zip(self.ops, segment_of)):
            # An input from elsewhere (an earlier segment, the caller) that needs a gradient is on
            # the path, as a pipeline stage's input is; within the segment, what the path led to.
            if not any(ptr in on_path or producer.get(ptr) != index for ptr in op.grad_reads):
                continue
            for t in op.results:
                on_path.add(storage_of(t).data_ptr())
            if op.view or not op.reads_trainable:
                continue
            for t in op.results:
                storage = storage_of(t)
                ptr = storage.data_ptr()
                if read_after.get(ptr, -1) > position or ptr in self.outputs:
                    segments[index].weight_grads[ptr] = storage.nbytes()
        # The dw runs every op that reads a trainable parameter again (a split node for its weight
        # half, an op off the input path whole), reading what each saved; the dx releases the rest
        # of a replay (hpr.split.release-unread).
        for op, index, saved in zip(self.ops, segment_of, saves):
            if op.view or not op.reads_trainable:
                continue
            for ptr, nbytes in saved:
                if ptr not in segments[index].inputs:
                    segments[index].weight_saved[ptr] = nbytes
        for op, index in zip(self.ops, segment_of):
            for t in op.results:  # an output root off the input path (hpr.split.seed-groups)
                storage = storage_of(t)
                ptr = storage.data_ptr()
                if ptr in on_path or not t.requires_grad or producer.get(ptr) != index:
                    continue
                if ptr in self.outputs or readers.get(ptr, set()) - {index}:
                    segments[index].weight_grads[ptr] = storage.nbytes()


def resolve_regions(model: nn.Module, spec: str) -> List[str]:
    """The module paths of ``--regions SPEC``: comma-separated submodule paths (FQNs), each the
    region itself, or, for a ``ModuleList`` / ``ModuleDict`` (which is never called) or a path
    written ``PATH.*``, each of its children in order: ``layers`` is ``layers.0,layers.1,...``.

    Raises:
        RegionError: an empty item, or a path that is no submodule (the message lists the
            top-level ones). A path named twice or inside another is the planner's to refuse
            (``segment_ops``).
    """
    modules = dict(model.named_modules())
    del modules[""]
    paths: List[str] = []
    for item in spec.split(","):
        item = item.strip()
        children = item.endswith(".*")
        path = item[:-2] if children else item
        if not path:
            raise RegionError(f"--regions: an empty module path in '{spec}' (expected e.g. layers or "
                              f"layers.0,layers.1)")
        if path not in modules:
            top = [n for n in modules if "." not in n]
            raise RegionError(f"--regions: '{path}' is no submodule of {type(model).__name__} "
                              f"(its top-level submodules: {', '.join(top) or 'none'})")
        module = modules[path]
        if children or isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            names = [f"{path}.{child}" for child, _ in module.named_children()]
            if not names:
                raise RegionError(f"--regions: '{item}' has no submodules")
            paths.extend(names)
        else:
            paths.append(path)
    return paths


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
                    depth: int = 1, name: str = "", regions: Optional[Sequence[str]] = None) -> List[Segment]:
    """Runs ``model(*inputs)`` once with autograd on and returns its segments in order.

    ``saved`` holds the distinct storages autograd saved for backward (parameters
    and buffers excluded), ``inputs``/``params`` the distinct storages each segment
    read that an earlier segment (or the caller) produced / that are parameters;
    ``tied`` those of its parameter storages another segment reads too (a tied weight,
    such as an embedding shared with the head), by the FQN of their first parameter, with
    their bytes (still counted in ``params``: docs/models.md, "Tied parameters");
    ``flops`` the planner's FLOPs of its ops (module doc); ``input_shapes`` and
    ``output_shapes`` a region module's arguments and results. An op without a FLOP
    rule is a ``UserWarning`` naming it and its region, once per op.

    Args:
        depth: the region depth (docs/models.md, "Region rules").
        name: names the model in the planner's messages (default: its class name).
        regions: module paths to take for the regions instead of the depth rule
            (``resolve_regions``; module doc); ``depth`` is then not used.

    Raises:
        RegionError: the planner's segmentation refused the run (a region's module called
            more than once, no region at ``depth``, a chosen region named twice, inside
            another or running no op), with its message.
        RunError: (``hp_recompute.plan.reader``) the planner extension is missing.
    """
    param_storages = {storage_of(p).data_ptr(): storage_of(p).nbytes()
                      for p in list(model.parameters()) + list(model.buffers())}
    trainable = {storage_of(p).data_ptr() for p in model.parameters() if p.requires_grad}
    tracker = _Tracker(param_storages, trainable)
    names = {m: n for n, m in model.named_modules() if n}
    handles = []

    def pre_hook(module: nn.Module, args: object) -> None:
        tracker.enter(names[module], args)

    def post_hook(module: nn.Module, args: object, out: object) -> None:
        tracker.leave(names[module], out)

    for module in names:
        handles.append(module.register_forward_pre_hook(pre_hook))
        handles.append(module.register_forward_hook(post_hook))
    try:
        with torch.autograd.graph.saved_tensors_hooks(tracker.on_saved, lambda t: t):
            with _OpMode(tracker):
                out = model(*inputs)
        tracker.outputs = {storage_of(t).data_ptr() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
    finally:
        for handle in handles:
            handle.remove()
    segments = tracker.segments(name or type(model).__name__, depth, regions or ())
    _name_tied(model, segments)
    outputs = {storage_of(t).data_ptr(): storage_of(t).nbytes()
               for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
    segments[-1].output_bytes = sum(outputs.values())
    return segments


def _name_tied(model: nn.Module, segments: Sequence[Segment]) -> None:
    """Fills each segment's ``tied``: its parameter storages that another segment reads too."""
    readers: Dict[int, int] = {}
    for seg in segments:
        for ptr in seg.params:
            readers[ptr] = readers.get(ptr, 0) + 1
    fqn: Dict[int, str] = {}
    for path, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        fqn.setdefault(storage_of(tensor).data_ptr(), path)
    for seg in segments:
        # Empty storages all have data_ptr 0: not one tensor, and nothing to count.
        seg.tied = {fqn[ptr]: nbytes for ptr, nbytes in seg.params.items() if readers[ptr] > 1 and nbytes > 0}
