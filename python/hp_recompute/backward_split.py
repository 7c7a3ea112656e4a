"""Split one backward into dx (``backward_input``) and dw (``backward_weight``).

NOTE [ dx/dw split ]
====================
Zero-bubble schedules run a stage's backward as two calls: I computes the gradients of
the stage inputs (so the previous stage can go on), W computes the weight gradients
later, in a bubble. This module keeps Work(I) + Work(W) = Work(B), by the algorithm
torch.distributed.pipelining's ``stage_backward_input`` / ``stage_backward_weight`` follow
(our own implementation of it), and implements the rules below; docs/rules.md states each
one and why:

  hpr.split.input-path            I runs the input path only
  hpr.split.split-nodes           I records the gradient each split node receives
  hpr.split.seed-groups           W: one ``autograd.grad`` per group of weights with the same seeds
  hpr.split.rewalk-shared-seeds   a group with seeds on one path re-walks from the outputs
  hpr.split.rewalk-old-torch      torch < 2.2: W re-walks from the outputs
  hpr.split.no-silent-none        W gives every weight a gradient or raises
  hpr.split.module-weights        the weights may be the stage module (FSDP2: NOTE in ``fsdp.py``)
  hpr.split.compiled-blocks       compiled blocks split too (NOTE in ``compile_split.py``)
  hpr.split.release-unread        I releases what no W node reads

Checkpointed regions need nothing special: I and W unpack their saved tensors through their
frames alike, so W reads what the session replayed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple, Union

import torch

from .compile_split import split_phase
from .errors import CheckpointError, error_text
from .sessions import recording_unpacks, release_unread, retained_while

__all__ = ["WeightGradState", "accumulate_grad", "backward_input", "backward_weight", "SPLIT_SUPPORTED"]

_graph = torch.autograd.graph
#: Whether W can start at recorded graph edges (hpr.split.rewalk-old-torch).
SPLIT_SUPPORTED = hasattr(_graph, "GradientEdge") and hasattr(_graph, "get_gradient_edge")

Grads = Tuple[Optional[torch.Tensor], ...]


@dataclass
class _Group:
    """Weights with the same seeds (hpr.split.seed-groups), or a fallback group
    (hpr.split.rewalk-shared-seeds)."""

    weights: List[int]  # indices into WeightGradState.weights
    seeds: List[Any]  # split nodes; empty: re-walk from the outputs


@dataclass
class WeightGradState:
    """What W needs after I: the weight groups and their seeds' recorded gradients."""

    weights: List[torch.Tensor]
    names: List[str]  # of the weights, for messages (hpr.split.no-silent-none)
    outputs: List[torch.Tensor]
    grad_outputs: List[Optional[torch.Tensor]]
    groups: List[_Group] = field(default_factory=list)
    recorded: Dict[Any, Grads] = field(default_factory=dict)
    #: hp_recompute.fsdp.SplitBinding when the weights are an FSDP module's (hpr.split.module-weights)
    fsdp: Any = None
    compiled: Dict[Any, Any] = field(default_factory=dict)  # I's stash per compiled node (hpr.split.compiled-blocks)
    unsplit: Set[Any] = field(default_factory=set)  # seeds that run whole in I and in W (hpr.split.compiled-blocks)
    done: bool = False  # W ran: the state is released


def _edge_node(t: torch.Tensor) -> Any:
    return _graph.get_gradient_edge(t).node


class _Graph:
    """The backward graph below the outputs: reachability and parents (hpr.split.input-path,
    hpr.split.seed-groups)."""

    def __init__(self, roots: Sequence[Any]) -> None:
        self.roots = roots
        self.order: List[Any] = []  # children before parents
        self.parents: Dict[Any, List[Any]] = {}
        visited: Set[Any] = set()
        stack: List[Tuple[Any, bool]] = [(root, False) for root in roots]
        while stack:
            node, children_done = stack.pop()
            if children_done:
                self.order.append(node)
                continue
            if node in visited:
                continue
            visited.add(node)
            self.parents.setdefault(node, [])
            stack.append((node, True))
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    self.parents.setdefault(nxt, []).append(node)
                    if nxt not in visited:
                        stack.append((nxt, False))

    def reaching(self, targets: Set[Any]) -> Set[Any]:
        """Nodes from which a target is reachable (targets included)."""
        out: Set[Any] = set()
        for node in self.order:
            if node in targets or any(nxt in out for nxt, _ in node.next_functions if nxt is not None):
                out.add(node)
        return out

    def seeds(self, weight: Any, on_input: Set[Any]) -> FrozenSet[Any]:
        """hpr.split.seed-groups: split nodes (or off-path roots) above ``weight`` through off-path nodes."""
        seeds: Set[Any] = set()
        stack, seen = [weight], {weight}
        while stack:
            node = stack.pop()
            parents = self.parents.get(node, [])
            if not parents and node not in on_input:
                seeds.add(node)  # an output root off the input path
            for parent in parents:
                if parent in on_input:
                    seeds.add(parent)
                elif parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
        return frozenset(seeds)

    def chained(self, seeds: FrozenSet[Any], on_input: Set[Any]) -> bool:
        """hpr.split.rewalk-shared-seeds: whether a seed is reachable from another one along the input path."""
        for seed in seeds:
            stack = [nxt for nxt, _ in seed.next_functions if nxt in on_input]
            seen: Set[Any] = set(stack)
            while stack:
                node = stack.pop()
                if node in seeds:
                    return True
                for nxt, _ in node.next_functions:
                    if nxt in on_input and nxt not in seen:
                        seen.add(nxt)
                        stack.append(nxt)
        return False


def _unsplit_seeds(graph: _Graph, seeds: Set[Any], on_input: Set[Any], weights: Sequence[torch.Tensor],
                   inputs: Sequence[torch.Tensor]) -> Set[Any]:
    """hpr.split.compiled-blocks: the seeds a compiled split would get wrong, to run whole in I and in W."""
    if any(isinstance(x, torch.nn.Parameter) for x in inputs):
        return set(seeds)
    leaves = {_edge_node(w) for w in weights}
    to_weights = graph.reaching(leaves)
    return {s for s in seeds
            if any(nxt in to_weights and nxt not in on_input and nxt not in leaves
                   for nxt, _ in s.next_functions if nxt is not None)}


def _record_roots(state: WeightGradState, on_input: Set[Any]) -> None:
    """hpr.split.split-nodes: an output root off the input path is a seed whose gradient is the output's."""
    for out, grad in zip(state.outputs, state.grad_outputs):
        if out.grad_fn is None or out.grad_fn in on_input:
            continue
        edge = _graph.get_gradient_edge(out)
        grads = list(state.recorded.get(edge.node, ()))
        grads.extend([None] * (edge.output_nr + 1 - len(grads)))
        grads[edge.output_nr] = torch.ones_like(out) if grad is None else grad
        state.recorded[edge.node] = tuple(grads)


def _weight_names(weights: Sequence[torch.Tensor], names: Optional[Sequence[str]]) -> List[str]:
    if names is None:
        return [f"#{i} (shape {tuple(w.shape)})" for i, w in enumerate(weights)]
    names = list(names)
    if len(names) != len(weights) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            error_text(f"backward_input: names must be one str per weight ({len(weights)}), got {names!r}")
        )
    return [repr(n) for n in names]


def backward_input(outputs: Sequence[torch.Tensor], grad_outputs: Optional[Sequence[Optional[torch.Tensor]]],
                   inputs: Sequence[torch.Tensor], weights: Union[Sequence[torch.Tensor], torch.nn.Module],
                   retain_graph: bool = True, names: Optional[Sequence[str]] = None) -> Tuple[Grads, WeightGradState]:
    """I: gradients of ``inputs``, and what ``backward_weight`` needs for ``weights``.

    Args:
        outputs: the stage outputs (or its loss).
        grad_outputs: their gradients (None: the outputs are scalar losses).
        inputs: tensors requiring grad whose gradients I returns (may be empty).
        weights: parameters requiring grad that W will differentiate; or the stage
            module, whose parameters requiring grad are the weights, named by
            ``named_parameters()`` (hpr.split.module-weights; an FSDP2 module must be given this way).
        retain_graph: keep the graph (True whenever W or another backward follows).
        names: one name per weight (e.g. from ``named_parameters()``) for the error
            of ``backward_weight`` (hpr.split.no-silent-none); default: the weight's index and shape.
            Not with a module.

    Returns:
        (one gradient per input, None where unused; the state for ``backward_weight``).

    Raises:
        ValueError: ``names`` is not one str per weight, or given with a module; a weight
            does not require grad.
        CheckpointError: an FSDP module's weight was never unsharded (no forward ran).
    """
    outputs = list(outputs)
    grads_out = list(grad_outputs) if grad_outputs is not None else [None] * len(outputs)
    binding = None
    if isinstance(weights, torch.nn.Module):  # hpr.split.module-weights
        if names is not None:
            raise ValueError(error_text("backward_input: names are the module's own (named_parameters()); "
                                        "pass names only with a list of weights"))
        named = [(n, p) for n, p in weights.named_parameters() if p.requires_grad]
        names, params = [n for n, _ in named], [p for _, p in named]
        from . import fsdp as _fsdp

        binding = _fsdp.bind(weights, params, names)
        weights = binding.graph_weights if binding is not None else params
    state = WeightGradState(list(weights), _weight_names(weights, names), outputs, grads_out, fsdp=binding)
    frozen = [name for name, w in zip(state.names, state.weights) if not w.requires_grad]
    if frozen:
        raise ValueError(error_text(
            f"backward_input: weight{'s' if len(frozen) > 1 else ''} {', '.join(frozen)} "
            f"{'do' if len(frozen) > 1 else 'does'} not require grad (frozen), so W has no gradient to give "
            f"{'them' if len(frozen) > 1 else 'it'}; leave frozen weights out of the weights (a module as the "
            f"weights leaves them out by itself)"))
    hooks = []
    if SPLIT_SUPPORTED and state.weights and not inputs:  # no input path: W is the whole backward
        roots = list(dict.fromkeys(o.grad_fn for o in outputs if o.grad_fn is not None))
        state.groups.append(_Group(list(range(len(state.weights))), roots))
        _record_roots(state, set())
    elif SPLIT_SUPPORTED and state.weights:
        graph = _Graph([o.grad_fn for o in outputs if o.grad_fn is not None])
        on_input = graph.reaching({_edge_node(x) for x in inputs})
        by_seeds: Dict[FrozenSet[Any], List[int]] = {}
        for i, w in enumerate(state.weights):
            by_seeds.setdefault(graph.seeds(_edge_node(w), on_input), []).append(i)
        for seeds, members in by_seeds.items():
            chained = len(seeds) > 1 and graph.chained(seeds, on_input)
            state.groups.append(_Group(members, [] if chained else list(seeds)))
        _record_roots(state, on_input)
        wanted = {s for g in state.groups for s in g.seeds if s in on_input}

        def record(node: Any) -> Any:
            def hook(grads: Grads) -> None:
                state.recorded[node] = grads
            return hook

        hooks = [node.register_prehook(record(node)) for node in wanted]
        state.unsplit = _unsplit_seeds(graph, wanted, on_input, state.weights, inputs)
    # hpr.split.release-unread: W runs the seeds only where every group has them.
    readers = ({seed for g in state.groups for seed in g.seeds}
               if SPLIT_SUPPORTED and inputs and state.groups and all(g.seeds for g in state.groups) else None)
    try:  # compiled nodes told their half (hpr.split.compiled-blocks), unpacks recorded (hpr.split.release-unread)
        with split_phase("input", state.compiled, wanted - state.unsplit if hooks else ()), \
                recording_unpacks() if readers is not None else contextlib.nullcontext() as record:
            dinputs = (torch.autograd.grad(outputs, list(inputs), grads_out, retain_graph=retain_graph,
                                           allow_unused=True) if inputs else ())
    finally:
        for h in hooks:
            h.remove()
    if record is not None:
        release_unread(record, readers)
    if binding is not None:
        binding.started(state.names)  # hpr.fsdp.dx-hooks
    return tuple(dinputs), state


def backward_weight(state: WeightGradState, retain_graph: bool = False) -> Grads:
    """W: gradients of ``state.weights`` from what ``backward_input`` recorded (hpr.split.seed-groups).

    Returns one gradient per weight. The state is released: W runs once per I. When
    ``backward_input`` was given an FSDP module (hpr.split.module-weights), W has already added these
    (local, unreduced) gradients to FSDP's unsharded gradients; do not add them to
    ``.grad`` too, ``hp_recompute.fsdp.reduce_gradients`` does (hpr.fsdp.dw-accumulates).

    Raises:
        CheckpointError: W got no gradient for a weight (hpr.split.no-silent-none), because the graph of the
            outputs does not reach it; the message names every such weight. With FSDP:
            the step of this W's I was already reduced (hpr.fsdp.dw-accumulates). W of this state ran
            already.
    """
    if state.done:
        raise CheckpointError(error_text(
            "backward_weight: this state's W already ran (W runs once per backward_input, and its state is released "
            "then); call backward_input again for another W"))
    state.done = True
    binding, state.fsdp = state.fsdp, None
    if binding is None:
        return _weight_grads(state, retain_graph)
    binding.check_open(state.names)
    unsharded = binding.unshard()  # hpr.fsdp.dw-accumulates
    try:
        out = _weight_grads(state, retain_graph, fsdp=True)
    finally:
        binding.reshard(unsharded)
    binding.accumulate(out)
    binding.finished()
    return out


def _weight_grads(state: WeightGradState, retain_graph: bool, fsdp: bool = False) -> Grads:
    out: List[Optional[torch.Tensor]] = [None] * len(state.weights)
    if not SPLIT_SUPPORTED:  # hpr.split.rewalk-old-torch
        groups = [_Group(list(range(len(state.weights))), [])] if state.weights else []
    else:
        groups = state.groups
    for k, group in enumerate(groups):
        keep = retain_graph or k + 1 < len(groups)
        targets = [state.weights[i] for i in group.weights]
        if group.seeds:
            edges, grads = [], []
            for seed in group.seeds:
                for nr, g in enumerate(state.recorded.get(seed, ())):
                    if g is not None:
                        edges.append(_graph.GradientEdge(seed, nr))
                        grads.append(g)
            if not edges:
                continue
            with split_phase("weight", state.compiled, [n for n in group.seeds if n not in state.unsplit]), \
                    retained_while(k + 1 < len(groups)):  # hpr.split.compiled-blocks, hpr.split.seed-groups
                got = torch.autograd.grad(edges, [_graph.get_gradient_edge(t) for t in targets], grads,
                                          retain_graph=keep, allow_unused=True)
        else:  # hpr.split.rewalk-shared-seeds, hpr.split.rewalk-old-torch: re-walk from the outputs
            with retained_while(k + 1 < len(groups)):
                got = torch.autograd.grad(state.outputs, targets, state.grad_outputs, retain_graph=keep,
                                          allow_unused=True)
        for i, g in zip(group.weights, got):
            out[i] = g
    missing = [state.names[i] for i, g in enumerate(out) if g is None]
    state.groups, state.recorded, state.outputs, state.grad_outputs, state.compiled = [], {}, [], [], {}
    if missing:
        which = f"weight {missing[0]} is" if len(missing) == 1 else f"weights {', '.join(missing)} are"
        if fsdp:  # the module's own parameters: the graph is FSDP's unsharded ones (hpr.split.module-weights)
            raise CheckpointError(
                error_text(
                    f"backward_weight: {which} not reached by the graph of the outputs, so W would give no "
                    "gradient and FSDP would reduce none: the module's forward did not use "
                    f"{'it' if len(missing) == 1 else 'them'}; freeze such parameters (requires_grad_(False)) "
                    "or give backward_input the submodule the outputs use; then "
                    "hp_recompute.fsdp.discard_step(module) drops this step [hpr.split.no-silent-none]"
                )
            )
        raise CheckpointError(
            error_text(
                f"backward_weight: {which} not reached by the graph of the outputs, so W would give no "
                "gradient (is the module fully_shard-ed with reshard_after_forward=True? FSDP2 then "
                "keeps its sharded parameters outside the graph: pass the module itself as the weights of "
                "backward_input; otherwise leave a weight the outputs do not use out of the weights of "
                "backward_input, or freeze it) [hpr.split.no-silent-none]"
            )
        )
    return tuple(out)


def accumulate_grad(weights: Sequence[torch.Tensor], grads: Sequence[Optional[torch.Tensor]]) -> None:
    """Adds W's gradients into each weight's ``.grad``, as AccumulateGrad does in one backward.

    For weights given as a list; W of an FSDP module has already added its own (hpr.fsdp.dw-accumulates).
    """
    with torch.no_grad():
        for w, g in zip(weights, grads):
            if g is None:
                continue
            if w.grad is None:
                w.grad = g
            else:
                w.grad.add_(g)
