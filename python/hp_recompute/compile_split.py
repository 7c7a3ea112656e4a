"""A torch.compile backend whose backward splits into a dx (I) and a dw (W) graph.

NOTE [ Compiled dx/dw split ]
=============================
aot_autograd turns a compiled block into ONE autograd node whose backward computes every
input's and every parameter's gradient, so ``backward_input`` and ``backward_weight``
(NOTE [ dx/dw split ]) would each run all of it. ``compile_backend(...)`` is a
torch.compile backend whose backward is two graphs, I and W, one for each. This module
implements the rules below; docs/rules.md states each one and why:

  hpr.compiled-split.backend                compiles as inductor or aot_eager, then splits the backward
  hpr.compiled-split.w-outputs              parameters' gradients are W's outputs, the others I's
  hpr.compiled-split.partition              every node of the backward in exactly one of I and W
  hpr.compiled-split.phase                  the node runs I, W or both by who registered it
  hpr.compiled-split.no-donated-buffers     no saved buffer reused, no cached unsplit backward
  hpr.compiled-split.supported              torch >= 2.13, no CUDA graphs
  hpr.compiled-split.wrapper-compile        ``checkpoint_wrapper(block).compile()`` splits, the checkpoint stays eager
  hpr.compiled-split.saved-ops-dispatched   ``saved_ops`` stay dispatched for a selective policy
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from .errors import CheckpointError, error_text

__all__ = ["SUPPORTED", "compile_backend", "dispatches_each_op", "split_compile_kwargs", "stashed_tensors"]


def _version() -> Tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


#: Whether this torch can split compiled backwards (hpr.compiled-split.supported).
SUPPORTED = (_version() >= (2, 13) and hasattr(torch, "compile")
             and hasattr(torch._C, "_current_autograd_node"))

BACKENDS = ("inductor", "aot_eager")


# -- the phase registry (hpr.compiled-split.phase) ---------------------------------------

_LOCK = threading.Lock()
_ACTIVE: Dict[Any, Tuple[str, Dict[Any, Any]]] = {}  # autograd node -> (phase, state.compiled)
# (backend, options, saved ops) -> its compile_backend; the registry stays empty while none exists
_COMPILERS: Dict[Tuple[str, str, Tuple[str, ...]], Callable] = {}


@contextlib.contextmanager
def split_phase(phase: str, stash: Dict[Any, Any], nodes: Iterable[Any]) -> Iterator[None]:
    """hpr.compiled-split.phase: mark ``nodes`` as run by ``phase`` ("input" or "weight") of one split.

    Called by ``backward_split``; a no-op until a ``compile_backend`` backward exists.
    """
    if not _COMPILERS:
        yield
        return
    nodes = list(nodes)
    with _LOCK:
        previous = [_ACTIVE.get(n) for n in nodes]
        for n in nodes:
            _ACTIVE[n] = (phase, stash)
    try:
        yield
    finally:
        with _LOCK:
            for n, p in zip(nodes, previous):
                if p is None:
                    _ACTIVE.pop(n, None)
                else:
                    _ACTIVE[n] = p


def stashed_tensors(stash: Dict[Any, Any]) -> List[torch.Tensor]:
    """hpr.compiled-split.phase: the tensors I keeps for W in a WeightGradState's ``compiled`` dict (a split
    node whose W has not run yet)."""
    return [t for kind, values in stash.values() if kind == "stash" for t in values if isinstance(t, torch.Tensor)]


def _phase_of_running_node() -> Tuple[Optional[str], Optional[Dict[Any, Any]], Any]:
    node = torch._C._current_autograd_node()
    if node is None:
        return None, None, None
    with _LOCK:
        found = _ACTIVE.get(node)
    return (found[0], found[1], node) if found is not None else (None, None, node)


# -- the partition (hpr.compiled-split.w-outputs, hpr.compiled-split.partition) ----------


class _Partition:
    """The I and W graphs of one backward graph, and how to call them (hpr.compiled-split.partition)."""

    def __init__(self, gm: torch.fx.GraphModule, is_weight: Callable[[Any], bool]) -> None:
        graph = gm.graph
        placeholders = list(graph.find_nodes(op="placeholder"))
        out_node = next(iter(reversed(graph.nodes)))
        if out_node.op != "output":
            raise CheckpointError(error_text("compile_backend: the backward graph has no output node"))
        outs = list(out_node.args[0])
        descs = out_node.meta.get("desc")
        if descs is None or len(descs) != len(outs):
            raise CheckpointError(error_text(
                f"compile_backend: the backward graph carries no gradient descriptors; torch {torch.__version__} "
                "is not supported, use a plain backend [hpr.compiled-split.w-outputs]"))
        from torch._functorch._aot_autograd.descriptors import GradAOTOutput

        self.n_outputs = len(outs)
        self.i_pos: List[int] = []
        self.w_pos: List[int] = []
        for k, (o, d) in enumerate(zip(outs, descs)):
            if not isinstance(o, torch.fx.Node):
                continue
            if not isinstance(d, GradAOTOutput):
                raise CheckpointError(error_text(
                    f"compile_backend: backward output {k} is {d!r}, not a gradient (effect tokens or "
                    "functionalized RNG); such a block cannot be split, compile it with a plain backend "
                    "[hpr.compiled-split.w-outputs]"))
            (self.w_pos if is_weight(d.grad_of) else self.i_pos).append(k)

        def ancestors(roots: Sequence[torch.fx.Node]) -> set:
            seen: set = set()
            stack = list(roots)
            while stack:
                n = stack.pop()
                if n in seen:
                    continue
                seen.add(n)
                stack.extend(n.all_input_nodes)
            return seen

        need_i = ancestors([outs[k] for k in self.i_pos])
        need_w = ancestors([outs[k] for k in self.w_pos])
        w_only = {n for n in need_w if n not in need_i and n.op != "placeholder"}
        order = {n: i for i, n in enumerate(graph.nodes)}
        stash = {n for n in need_i if n.op != "placeholder" and any(u in w_only for u in n.users)}
        stash |= {outs[k] for k in self.w_pos if outs[k] in need_i and outs[k].op != "placeholder"}
        self.stash = sorted(stash, key=order.__getitem__)
        w_args = {p for p in placeholders if any(u in w_only for u in p.users)}
        w_args |= {outs[k] for k in self.w_pos if outs[k].op == "placeholder"}
        # The symbolic sizes (dynamic shapes): inductor binds each symbol from these.
        w_args |= {p for p in placeholders if isinstance(p.meta.get("val"), torch.SymInt)}
        self.w_args = [i for i, p in enumerate(placeholders) if p in w_args]
        self.n_stash = len(self.stash)

        # I: every placeholder (the backward's calling convention), the I outputs and the stash.
        gi, env = torch.fx.Graph(), {}
        for n in graph.nodes:
            if n.op == "placeholder" or (n in need_i and n.op != "output"):
                env[n] = gi.node_copy(n, env.__getitem__)
        gi.output(tuple(env[outs[k]] for k in self.i_pos) + tuple(env[n] for n in self.stash))
        # W: the placeholders it reads, then the stash; the W outputs.
        gw, wenv = torch.fx.Graph(), {}
        for i in self.w_args:
            wenv[placeholders[i]] = gw.node_copy(placeholders[i], wenv.__getitem__)
        for n in self.stash:
            p = gw.placeholder(f"stash_{n.name}")
            p.meta.update(n.meta)
            wenv[n] = p
        for n in graph.nodes:
            if n in w_only:
                wenv[n] = gw.node_copy(n, wenv.__getitem__)
        gw.output(tuple(wenv[outs[k]] for k in self.w_pos))
        for g in (gi, gw):
            next(iter(reversed(g.nodes))).meta["user_visible_output_idxs"] = []
            g.lint()
        self.gi = torch.fx.GraphModule(gm, gi)
        self.gw = torch.fx.GraphModule(gm, gw)

    def example_inputs(self, example_inputs: Sequence[Any]) -> Tuple[List[Any], List[Any]]:
        w = [example_inputs[i] for i in self.w_args] + [n.meta.get("val") for n in self.stash]
        return list(example_inputs), w

    def static_idxs(self, static: Sequence[int]) -> Tuple[List[int], List[int]]:
        where = {old: new for new, old in enumerate(self.w_args)}
        return list(static), [where[i] for i in static if i in where]


class _SplitBackward:
    """The compiled backward aot_autograd calls: I, W or both by the phase (hpr.compiled-split.phase)."""

    def __init__(self, part: _Partition, run_i: Optional[Callable], run_w: Optional[Callable]) -> None:
        self._boxed_call = True  # an instance attribute: torch._dynamo.disable's wrapper copies __dict__
        self.part = part
        self.run_i = run_i  # None: no I output and no stash
        self.run_w = run_w  # None: no W output

    def _i(self, args: List[Any]) -> Tuple[List[Any], List[Any]]:
        if self.run_i is None:
            return [], []
        out = list(self.run_i(list(args)))
        n_i = len(self.part.i_pos)
        return out[:n_i], out[n_i:]

    def _w(self, args: List[Any], stash: List[Any]) -> List[Any]:
        if self.run_w is None:
            return []
        return list(self.run_w([args[i] for i in self.part.w_args] + list(stash)))

    def _assemble(self, i_out: Sequence[Any], w_out: Sequence[Any]) -> List[Any]:
        grads: List[Any] = [None] * self.part.n_outputs
        for k, g in zip(self.part.i_pos, i_out):
            grads[k] = g
        for k, g in zip(self.part.w_pos, w_out):
            grads[k] = g
        return grads

    def __call__(self, args: List[Any]) -> List[Any]:
        phase, stash, node = _phase_of_running_node()
        try:
            if phase == "input" and self.part.w_pos:
                i_out, kept = self._i(args)
                stash[node] = ("stash", kept)
                return self._assemble(i_out, [])
            if phase == "weight" and node in stash:
                kind, value = stash[node]
                if kind == "stash":
                    value = self._w(args, value)
                    stash[node] = ("done", value)  # another group with this seed reads it (hpr.compiled-split.phase)
                return self._assemble([], value)
            i_out, kept = self._i(args)  # no split: the whole backward
            return self._assemble(i_out, self._w(args, kept))
        finally:
            args.clear()  # aot_autograd hands its arguments over (steal_args)


def _weights_of(example_inputs: Sequence[Any]) -> Callable[[Any], bool]:
    """hpr.compiled-split.w-outputs: whether an aot_autograd input descriptor names a parameter."""
    from torch._functorch._aot_autograd.descriptors import ParamAOTInput, PlainAOTInput

    params = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}

    def is_weight(desc: Any) -> bool:
        if isinstance(desc, ParamAOTInput):
            return True
        return isinstance(desc, PlainAOTInput) and desc.idx in params

    return is_weight


def _no_donated_buffers() -> None:
    """hpr.compiled-split.no-donated-buffers: the backward being compiled reuses no saved buffer, and
    aot_autograd knows it."""
    ctx = torch._guards.TracingContext.try_get()
    if ctx is not None and getattr(ctx, "fw_metadata", None) is not None:
        ctx.fw_metadata.bw_donated_idxs = []


def _split(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], is_weight: Callable[[Any], bool],
           compile_one: Callable[[torch.fx.GraphModule, List[Any], List[int]], Callable],
           static_input_idxs: Sequence[int] = ()) -> _SplitBackward:
    """Partition one backward graph and compile its halves (hpr.compiled-split.partition,
    hpr.compiled-split.no-donated-buffers)."""
    _no_donated_buffers()
    part = _Partition(gm, is_weight)
    ex_i, ex_w = part.example_inputs(example_inputs)
    static_i, static_w = part.static_idxs(static_input_idxs)
    run_i = compile_one(part.gi, ex_i, static_i) if (part.i_pos or part.stash) else None
    run_w = compile_one(part.gw, ex_w, static_w) if part.w_pos else None
    return _SplitBackward(part, run_i, run_w)


def _check_supported(what: str) -> None:
    if not hasattr(torch, "compile"):
        raise CheckpointError(error_text(
            f"{what}: torch {torch.__version__} has no torch.compile; the compiled dx/dw split needs torch >= 2.13 "
            "(on this torch, run the block eagerly: backward_input/backward_weight split it exactly)"))
    if not SUPPORTED:
        raise CheckpointError(error_text(
            f"{what}: splitting a compiled backward needs torch >= 2.13 (aot_autograd's graph descriptors); "
            f"this is torch {torch.__version__}: use a plain torch.compile backend (I and W then each run the "
            "whole compiled backward) [hpr.compiled-split.supported]"))


def compile_backend(backend: str = "inductor", options: Optional[Dict[str, Any]] = None,
                    saved_ops: Iterable[Any] = ()) -> Callable:
    """A torch.compile backend whose backward I and W split (NOTE [ Compiled dx/dw split ]).

    Args:
        backend: ``"inductor"`` or ``"aot_eager"``: what compiles the forward and the two
            halves of the backward.
        options: inductor config patches (as ``torch.compile(options=...)``); inductor only.
        saved_ops: the ``OpOverload``s a selective policy around the block saves, kept
            dispatched in the forward (hpr.compiled-split.saved-ops-dispatched); inductor only.

    Returns:
        A callable to pass as ``torch.compile(..., backend=)``: the same one for the same
        backend, options and saved ops (blocks compiled one by one share dynamo's compiled
        code).

    Raises:
        CheckpointError: torch older than 2.13, or without torch.compile (hpr.compiled-split.supported).
        ValueError: an unknown backend, or options or saved ops with aot_eager.

    Example::

        block.compile(backend=hp_recompute.compile_backend("inductor"))
        y = hp_recompute.checkpoint(block, x)
        dx, state = hp_recompute.backward_input([y], [dy], [x], block)  # I: dx only
        dw = hp_recompute.backward_weight(state)                         # W: dw only
    """
    _check_supported("compile_backend")
    if backend not in BACKENDS:
        raise ValueError(error_text(f"compile_backend: backend must be one of {BACKENDS}, got {backend!r}"))
    if options and backend != "inductor":
        raise ValueError(error_text("compile_backend: options are inductor config patches; aot_eager takes none"))
    saved_ops = frozenset(saved_ops)
    if saved_ops and backend != "inductor":
        raise ValueError(error_text(
            "compile_backend: aot_eager dispatches every op; saved_ops are inductor's "
            "[hpr.compiled-split.saved-ops-dispatched]"))

    # One callable per backend and options: dynamo guards a compiled frame on its backend's
    # identity, so blocks of one class compiled one by one (checkpoint_wrapper(block).compile())
    # must share it, or each would recompile the shared forward, failing past dynamo's
    # recompile limit (8): FailOnRecompileLimitHit under fullgraph=True, else eager blocks.
    options = dict(options) if options else None  # the caller's dict may change after this call
    key = (backend, repr(sorted((options or {}).items())), tuple(sorted(str(op) for op in saved_ops)))
    with _LOCK:
        if key in _COMPILERS:
            return _COMPILERS[key]

    def compiler(gm: torch.fx.GraphModule, example_inputs: List[Any], **kwargs: Any) -> Callable:
        is_weight = _weights_of(example_inputs)
        patches = {"donated_buffer": False, "enable_autograd_cache": False}  # hpr.compiled-split.no-donated-buffers
        with torch._functorch.config.patch(**patches):
            if backend == "aot_eager":
                return _aot_eager(gm, example_inputs, is_weight, **kwargs)
            return _inductor(gm, example_inputs, is_weight, options, saved_ops, **kwargs)

    compiler.__name__ = f"hp_recompute_{backend}"
    with _LOCK:  # from now on I and W register their seeds, also for a backward compiled lazily in I
        return _COMPILERS.setdefault(key, compiler)


def _aot_eager(gm: torch.fx.GraphModule, example_inputs: List[Any], is_weight: Callable[[Any], bool],
               **kwargs: Any) -> Callable:
    from torch._dynamo.backends.debugging import aot_eager, boxed_nop

    def bw_compiler(bw: torch.fx.GraphModule, bw_inputs: List[Any]) -> Callable:
        return _split(bw, bw_inputs, is_weight, lambda half, half_ex, _: boxed_nop(half, half_ex))

    return aot_eager(gm, example_inputs, bw_compiler=bw_compiler, **kwargs)


def _inductor(gm: torch.fx.GraphModule, example_inputs: List[Any], is_weight: Callable[[Any], bool],
              options: Optional[Dict[str, Any]], saved_ops: FrozenSet[Any], **kwargs: Any) -> Callable:
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner_compile(g: torch.fx.GraphModule, ex: Sequence[Any], **kw: Any) -> Any:
        if not kw.get("is_backward"):
            if not saved_ops:
                return compile_fx_inner(g, ex, **kw)
            for n in g.graph.nodes:  # hpr.compiled-split.saved-ops-dispatched
                if n.op == "call_function" and n.target in saved_ops:
                    n.meta["should_fallback"] = True
            with torch._inductor.config.patch(inplace_buffers=False, allow_buffer_reuse=False, pattern_matcher=False,
                                              fx_graph_cache=False):
                return compile_fx_inner(g, ex, **kw)
        def compile_half(half: torch.fx.GraphModule, half_ex: List[Any], static: List[int]) -> Any:
            return compile_fx_inner(half, half_ex, **{**kw, "static_input_idxs": static})

        return _split(g, ex, is_weight, compile_half, kw.get("static_input_idxs") or ())

    return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=options, **kwargs)


def dispatches_each_op(backend: Any) -> bool:
    """Whether a block compiled with ``backend`` still dispatches each aten op when it runs
    (``"eager"``, ``"aot_eager"``, ``compile_backend("aot_eager")``), so that a dispatch mode
    around it, a selective policy's, sees them (hpr.selective.visible-ops)."""
    if isinstance(backend, str):
        return backend in ("eager", "aot_eager")
    return getattr(backend, "__name__", None) == "hp_recompute_aot_eager"


def split_compile_kwargs(kwargs: Dict[str, Any], saved_ops: Iterable[Any] = ()) -> Dict[str, Any]:
    """hpr.compiled-split.wrapper-compile: the ``torch.compile`` keywords ``kwargs``, with a backend whose
    backward splits (with inductor, keeping ``saved_ops`` dispatched: hpr.compiled-split.saved-ops-dispatched).

    Raises:
        CheckpointError: a mode or options that capture CUDA graphs (hpr.compiled-split.supported).
    """
    backend = kwargs.get("backend", "inductor")
    if not SUPPORTED or not isinstance(backend, str) or backend not in BACKENDS:
        return dict(kwargs)
    rest = {k: v for k, v in kwargs.items() if k not in ("backend", "mode", "options")}
    options = dict(kwargs.get("options") or {})
    mode = kwargs.get("mode")
    if mode is not None and mode != "default":
        if backend != "inductor":
            raise ValueError(error_text(f"compile: mode={mode!r} is an inductor mode; backend {backend!r} takes none"))
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode, kwargs.get("dynamic")), **options}
    if options.get("triton.cudagraphs"):
        raise CheckpointError(error_text(
            f"compile: mode={mode!r} / options capture CUDA graphs, which would overwrite the stash that W reads; "
            "use a mode without CUDA graphs, e.g. 'max-autotune-no-cudagraphs' [hpr.compiled-split.supported]"))
    saved = saved_ops if backend == "inductor" else ()
    return {**rest, "backend": compile_backend(backend, options=options or None, saved_ops=saved)}
