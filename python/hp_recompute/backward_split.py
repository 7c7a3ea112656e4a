"""Split one backward into dx (``backward_input``) and dw (``backward_weight``).

NOTE [ dx/dw split ]
====================
Zero-bubble schedules run a stage's backward as two calls: I computes the gradients of
the stage inputs (so the previous stage can go on), W computes the weight gradients
later, in a bubble. Calling ``autograd.grad(out, weights)`` for W re-walks the whole
input path (for L Linear layers: I + W = 3L - 1 matmuls against 2L for one backward).
The rules below keep Work(I) + Work(W) = Work(B); the code cites them as "Rule N".
The algorithm is the one torch.distributed.pipelining's ``stage_backward_input`` /
``stage_backward_weight`` follow; this is our own implementation of it.

Rule 1 (input path). A node of the backward graph is on the *input path* when one of
  the stage inputs' gradient edges is reachable from it. I runs exactly these nodes
  (``autograd.grad(outputs, inputs)`` prunes every other edge), and each computes only
  the outputs that lead towards an input.

Rule 2 (split nodes). A node on the input path with a next edge that leaves the input
  path towards a weight is a *split node*. During I a pre-hook records the gradient the
  split node receives (its complete gradient: every node that feeds it is on the input
  path, so it has run). An output root off the input path (stage 0, whose input is
  integer tokens) is a split node whose gradient is the output gradient.

Rule 3 (weights). A weight's *seeds* are the split nodes from which it is reached through
  nodes off the input path only. W calls ``autograd.grad`` once per group of weights with
  the same seeds, from the seeds' recorded gradient edges to the group's weights. The
  engine re-enters each seed computing only its weight-bound outputs (the ``dW = x^T g``
  half of a matmul) and runs the nodes below it that only weights reach. One call per
  group, not one for all: from a seed, another seed further down the input path leads to
  *its* weights, so a single call would walk the input path again and count the lower
  seed's gradient twice. Groups share no work, so per-group calls add no FLOPs. Inside
  a session context that drops what it reads (W as the last consumer), every group's call
  but the last retains what it reads (``sessions.retained_while``): two groups may read
  one checkpoint (weights tied across blocks); the session's clear drops the rest.

Rule 4 (shared seeds on one path). Within a group, a seed reachable from another seed
  along the input path (a weight used twice in a stage, e.g. tied) has the same hazard;
  that group falls back to ``autograd.grad(outputs, weights)`` (the input path walked
  again, gradients exact). A group has one seed in every bundled model.

Rule 6 (no silent None). W returns a gradient for every weight or raises naming the
  weights it got none for: a weight the outputs' graph does not reach (left in
  ``weights`` by mistake, or a parameter that is not the tensor the forward used, as
  FSDP2's sharded DTensor parameters after ``reshard_after_forward=True``) is an error,
  never a None that an optimizer step would silently skip.

Rule 5 (torch without gradient edges). ``autograd.grad`` accepts graph edges since
  torch 2.2 (``torch.autograd.graph.GradientEdge``). On older torch (Debian's 1.13),
  W is ``autograd.grad(outputs, weights)``: correct gradients, the input path walked
  twice.

Rule 7 (a module as the weights). ``weights`` may be the stage module itself: its
  parameters that require grad, named by ``named_parameters()``. A module containing
  FSDP2 modules (``fully_shard``, HSDP) makes the split drive FSDP: the weights are
  FSDP's unsharded parameters, W adds into FSDP's unsharded gradients, and
  ``hp_recompute.fsdp.reduce_gradients(module)`` reduces them once per step (NOTE [ FSDP2
  and the dx/dw split ] in ``fsdp.py``).

Rule 8 (compiled blocks). A block compiled by torch.compile is one autograd node whose
  backward computes every gradient. Compiled with ``hp_recompute.compile_backend(...)``,
  its backward is two graphs, and I and W tell it which one to run by registering the
  seeds they run for the length of their ``autograd.grad`` call; what W needs from I is
  kept in ``WeightGradState.compiled`` (NOTE [ Compiled dx/dw split ] in
  ``compile_split.py``). Its split gives W the gradients of its *parameter* inputs only,
  and I those of the others. So a seed is not registered, and runs its whole backward in
  I and again in W (exact, the work of two backwards for that node), when W needs a
  gradient of another input: a next edge that leaves the input path towards a weight
  through other nodes (a parameter sliced or scaled before the block, ``blk(x, E[:T])``);
  and nothing is registered when a stage input is itself an ``nn.Parameter`` (its
  gradient would be W's, and I's dx None).

Rule 9 (I frees what W does not read). Inside a session that I retains for W, I
  records which autograd node unpacks each replayed tensor; when every group has seeds
  (no Rule 4 or 5 re-walk), the tensors that only nodes other than seeds unpacked are
  released when I returns: W runs the seeds and nodes off the input path only, and a
  node off the input path never leads back onto it (it would reach an input), so no W
  node reads them. What the seeds unpacked, and what I did not unpack at all (the
  nodes below the seeds), stays for W, and so does everything of a checkpoint with a
  ``context_fn`` (the selective policy). The session then holds, from I to W, what the
  planner prices as the region's ``replay_weight_bytes``. A released tensor read again
  raises CheckpointError, never replays silently.

Checkpointed regions need nothing special: their saved tensors are unpacked through
their frames in I and in W alike, so W reads what the session replayed (or replays
again outside a session, as torch's own checkpoint does for each backward call).
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
#: Whether W can start at recorded graph edges (Rule 5).
SPLIT_SUPPORTED = hasattr(_graph, "GradientEdge") and hasattr(_graph, "get_gradient_edge")

Grads = Tuple[Optional[torch.Tensor], ...]


@dataclass
class _Group:
    """Weights with the same seeds (Rule 3), or a fallback group (Rule 4)."""

    weights: List[int]  # indices into WeightGradState.weights
    seeds: List[Any]  # split nodes; empty: re-walk from the outputs


@dataclass
class WeightGradState:
    """What W needs after I: the weight groups and their seeds' recorded gradients."""

    weights: List[torch.Tensor]
    names: List[str]  # of the weights, for messages (Rule 6)
    outputs: List[torch.Tensor]
    grad_outputs: List[Optional[torch.Tensor]]
    groups: List[_Group] = field(default_factory=list)
    recorded: Dict[Any, Grads] = field(default_factory=dict)
    fsdp: Any = None  # hp_recompute.fsdp.SplitBinding when the weights are an FSDP module's (Rule 7)
    compiled: Dict[Any, Any] = field(default_factory=dict)  # I's stash per compiled node (Rule 8)
    unsplit: Set[Any] = field(default_factory=set)  # seeds that run whole in I and in W (Rule 8)
    done: bool = False  # W ran: the state is released


def _edge_node(t: torch.Tensor) -> Any:
    return _graph.get_gradient_edge(t).node


class _Graph:
    """The backward graph below the outputs: reachability and parents (Rules 1 and 3)."""

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
        """Rule 3: split nodes (or off-path roots) above ``weight`` through off-path nodes."""
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
        """Rule 4: whether a seed is reachable from another one along the input path."""
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
    """Rule 8: the seeds a compiled split would get wrong, to run whole in I and in W."""
    if any(isinstance(x, torch.nn.Parameter) for x in inputs):
        return set(seeds)
    leaves = {_edge_node(w) for w in weights}
    to_weights = graph.reaching(leaves)
    return {s for s in seeds
            if any(nxt in to_weights and nxt not in on_input and nxt not in leaves
                   for nxt, _ in s.next_functions if nxt is not None)}


def _record_roots(state: WeightGradState, on_input: Set[Any]) -> None:
    """Rule 2: an output root off the input path is a seed whose gradient is the output's."""
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
            ``named_parameters()`` (Rule 7; an FSDP2 module must be given this way).
        retain_graph: keep the graph (True whenever W or another backward follows).
        names: one name per weight (e.g. from ``named_parameters()``) for the error
            of ``backward_weight`` (Rule 6); default: the weight's index and shape.
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
    if isinstance(weights, torch.nn.Module):  # Rule 7
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
    # Rule 9: W runs the seeds only where every group has them.
    readers = ({seed for g in state.groups for seed in g.seeds}
               if SPLIT_SUPPORTED and inputs and state.groups and all(g.seeds for g in state.groups) else None)
    try:
        with split_phase("input", state.compiled, wanted - state.unsplit if hooks else ()), \
                recording_unpacks() if readers is not None else contextlib.nullcontext() as record:  # Rules 8, 9
            dinputs = (torch.autograd.grad(outputs, list(inputs), grads_out, retain_graph=retain_graph,
                                           allow_unused=True) if inputs else ())
    finally:
        for h in hooks:
            h.remove()
    if record is not None:
        release_unread(record, readers)
    if binding is not None:
        binding.started(state.names)  # FSDP Rule 3
    return tuple(dinputs), state


def backward_weight(state: WeightGradState, retain_graph: bool = False) -> Grads:
    """W: gradients of ``state.weights`` from what ``backward_input`` recorded (Rule 3).

    Returns one gradient per weight. The state is released: W runs once per I. When
    ``backward_input`` was given an FSDP module (Rule 7), W has already added these
    (local, unreduced) gradients to FSDP's unsharded gradients; do not add them to
    ``.grad`` too, ``hp_recompute.fsdp.reduce_gradients`` does (NOTE [ FSDP2 and the dx/dw
    split ] Rule 4).

    Raises:
        CheckpointError: (Rule 6) W got no gradient for a weight, because the graph of the
            outputs does not reach it; the message names every such weight. With FSDP:
            the step of this W's I was already reduced (FSDP Rule 4). W of this state ran
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
    unsharded = binding.unshard()  # FSDP Rule 4
    try:
        out = _weight_grads(state, retain_graph, fsdp=True)
    finally:
        binding.reshard(unsharded)
    binding.accumulate(out)
    binding.finished()
    return out


def _weight_grads(state: WeightGradState, retain_graph: bool, fsdp: bool = False) -> Grads:
    out: List[Optional[torch.Tensor]] = [None] * len(state.weights)
    if not SPLIT_SUPPORTED:  # Rule 5
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
                    retained_while(k + 1 < len(groups)):  # Rules 8 and 3
                got = torch.autograd.grad(edges, [_graph.get_gradient_edge(t) for t in targets], grads,
                                          retain_graph=keep, allow_unused=True)
        else:  # Rules 4 and 5: re-walk from the outputs
            with retained_while(k + 1 < len(groups)):
                got = torch.autograd.grad(state.outputs, targets, state.grad_outputs, retain_graph=keep,
                                          allow_unused=True)
        for i, g in zip(group.weights, got):
            out[i] = g
    missing = [state.names[i] for i, g in enumerate(out) if g is None]
    state.groups, state.recorded, state.outputs, state.grad_outputs, state.compiled = [], {}, [], [], {}
    if missing:
        which = f"weight {missing[0]} is" if len(missing) == 1 else f"weights {', '.join(missing)} are"
        if fsdp:  # the module's own parameters: the graph is FSDP's unsharded ones (Rule 7)
            raise CheckpointError(
                error_text(
                    f"backward_weight: {which} not reached by the graph of the outputs, so W would give no "
                    "gradient and FSDP would reduce none (Rule 6): the module's forward did not use "
                    f"{'it' if len(missing) == 1 else 'them'}; freeze such parameters (requires_grad_(False)) "
                    "or give backward_input the submodule the outputs use; then "
                    "hp_recompute.fsdp.discard_step(module) drops this step"
                )
            )
        raise CheckpointError(
            error_text(
                f"backward_weight: {which} not reached by the graph of the outputs, so W would give no "
                "gradient (is the module fully_shard-ed with reshard_after_forward=True? FSDP2 then "
                "keeps its sharded parameters outside the graph: pass the module itself as the weights of "
                "backward_input (Rule 7, NOTE [ FSDP2 and the dx/dw split ]); otherwise leave a weight the "
                "outputs do not use out of the weights of backward_input, or freeze it)"
            )
        )
    return tuple(out)


def accumulate_grad(weights: Sequence[torch.Tensor], grads: Sequence[Optional[torch.Tensor]]) -> None:
    """Adds W's gradients into each weight's ``.grad``, as AccumulateGrad does in one backward.

    For weights given as a list; W of an FSDP module has already added its own (FSDP Rule 4).
    """
    with torch.no_grad():
        for w, g in zip(weights, grads):
            if g is None:
                continue
            if w.grad is None:
                w.grad = g
            else:
                w.grad.add_(g)
