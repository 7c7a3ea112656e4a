"""A torch.compile backend whose backward splits into a dx (I) and a dw (W) graph.

NOTE [ Compiled dx/dw split ]
=============================
aot_autograd turns a compiled block into ONE autograd node (its ``CompiledFunction``)
whose backward is one graph computing every input's and every parameter's gradient.
``backward_input`` and ``backward_weight`` (NOTE [ dx/dw split ]) each call that node,
so without help I and W each run all of it. ``compile_backend(...)`` is a torch.compile
backend that partitions the backward graph instead; the code cites these rules as
"Rule N".

Rule 1 (the backend). ``compile_backend("inductor")`` or ``compile_backend("aot_eager")``
  compiles as the named backend does (``compile_fx``, resp. aot_autograd with the min-cut
  partitioner and no-op compilers) and hands aot_autograd's backward graph to our
  splitter before it is compiled. Use it as ``torch.compile(block, backend=...)`` or in
  place, ``block.compile(backend=...)``; torchtitan's order, ``torch.compile(
  checkpoint_wrapper(block), backend=..., fullgraph=True)``, too (the replayed forward is
  part of the backward graph, Rule 3 puts it in I). A block compiled with a plain backend
  is not split (its graph is already compiled when a split sees it).

Rule 2 (which outputs are W). The backward graph has one output per input of the
  compiled forward, in order (aot_autograd's ``GradAOTOutput`` descriptors say which
  input each belongs to). The gradient of an input that is an ``nn.Parameter`` (as
  dynamo passes the module's parameters) is a W output; every other gradient is an I
  output. A backward graph with other outputs (effect tokens, functionalized RNG
  offsets) or without descriptors is refused at compile time, loudly.

Rule 3 (the partition). I is the backward graph restricted to what the I outputs need
  (dead code eliminated). W is what the W outputs need and I does not compute. The
  values of I that W reads are the *stash*: I returns them beside its outputs. W reads
  the stash and the backward's own arguments (saved activations, tangents, and every
  symbolic size under dynamic shapes), which the autograd node hands it again when W
  re-enters it. Every node of the backward graph
  lands in exactly one of I and W, so I + W does the work of one backward.

Rule 4 (the phase). ``backward_input`` registers the split nodes it records (its seeds,
  Rule 2 of NOTE [ dx/dw split ]) for the duration of its ``autograd.grad`` call, and
  ``backward_weight`` the seeds of each group it differentiates; the registry maps node
  to the WeightGradState's ``compiled`` dict, process-wide, so autograd's device threads
  see it too. When the compiled backward runs, it looks up its own node
  (``torch._C._current_autograd_node()``):
  - registered by I: run I, return None for the W outputs, keep the stash in the state;
  - registered by W, with a stash: run W from it, return None for the I outputs, and keep
    the W outputs for another group with the same seed (Rule 3 of NOTE [ dx/dw split ]);
  - otherwise (a plain backward, a node I did not reach, the re-walk of Rule 4 of NOTE
    [ dx/dw split ]): run I then W back to back, i.e. the whole backward.
  The stash lives in the WeightGradState: W (``backward_weight``) drops it, and so does
  dropping the state.

Rule 5 (no donated buffers). W reads saved activations after I ran, and the node runs
  with ``retain_graph=True``. The backend compiles the forward with
  ``torch._functorch.config.donated_buffer`` off and clears the backward's donated
  indices before compiling I and W, so no buffer is reused and aot_autograd never raises
  "compiled with non-empty donated buffers". The global config is not touched; nothing
  is asked of the user. The aot_autograd cache is bypassed while compiling, so a cached
  unsplit backward is never reused.

Rule 6 (versions). The backend needs aot_autograd's graph descriptors and
  ``_current_autograd_node``: torch >= 2.13 (``SUPPORTED``). On older torch, and on torch
  1.13 which has no torch.compile, ``compile_backend`` raises ``CheckpointError`` saying
  so. Not supported (untested, may fail): tensor-subclass (DTensor) inputs, CUDA graphs
  (``options={"triton.cudagraphs": True}`` would overwrite the stash), double backward.

Rule 7 (a wrapped block's ``compile()``). ``checkpoint_wrapper(block).compile(**kw)``
  (torchtitan compiles each wrapped block) compiles the *wrapped* block in place, so the
  checkpoint around it stays eager: handles, sessions, prefetch and FSDP's replay
  all-gather keep working, and a replay runs the compiled forward. ``split_compile_kwargs``
  turns ``kw`` into those of a split: backend ``"inductor"`` (torch.compile's default) or
  ``"aot_eager"`` becomes ``compile_backend(backend)``, inductor's ``mode`` and ``options``
  becoming its config patches; every other keyword (``fullgraph``, ``dynamic``, ...)
  passes unchanged. A mode or options that turn CUDA graphs on are refused (Rule 6).
  Another backend, or a torch older than 2.13, compiles as given, unsplit: I and W then
  each run the whole compiled backward. ``torch.compile(checkpoint_wrapper(block))``
  instead traces the checkpoint itself (torch's higher-order op, no handle).

Rule 8 (ops a selective policy saves). ``compile_backend("inductor", saved_ops=ops)``
  compiles the forward so that a selective policy's dispatch mode around the block sees,
  and may cache, each call of ``ops`` (NOTE [ Selective policy ] Rule 5): every node of
  those ops falls back to its eager kernel (inductor's ``should_fallback``), which returns
  its own output rather than writing into a buffer of the kernel's (``out=``), and the
  forward reuses no buffer and updates none in place, so no later kernel overwrites an
  output the policy keeps (without this, a GELU fused in place into its matmul's output
  changed the cached matmul under the replay). Pattern rewrites are off in that forward too,
  so none replaces a node that must stay dispatched; nor is the forward served from or
  written to the FX graph cache, whose key does not see the fallbacks. The backward
  compiles as without ``ops``. aot_eager dispatches every op and takes no ``ops``.
  ``checkpoint_wrapper(block, context_fn=...).compile()`` passes the ops its policy saves.
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


#: Whether this torch can split compiled backwards (Rule 6).
SUPPORTED = (_version() >= (2, 13) and hasattr(torch, "compile")
             and hasattr(torch._C, "_current_autograd_node"))

BACKENDS = ("inductor", "aot_eager")


# -- Rule 4: the phase registry ------------------------------------------------------

_LOCK = threading.Lock()
_ACTIVE: Dict[Any, Tuple[str, Dict[Any, Any]]] = {}  # autograd node -> (phase, state.compiled)
# (backend, options, saved ops) -> its compile_backend; the registry stays empty while none exists
_COMPILERS: Dict[Tuple[str, str, Tuple[str, ...]], Callable] = {}


@contextlib.contextmanager
def split_phase(phase: str, stash: Dict[Any, Any], nodes: Iterable[Any]) -> Iterator[None]:
    """Rule 4: mark ``nodes`` as run by ``phase`` ("input" or "weight") of one split.

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
    """Rule 4: the tensors I keeps for W in a WeightGradState's ``compiled`` dict (a split node
    whose W has not run yet)."""
    return [t for kind, values in stash.values() if kind == "stash" for t in values if isinstance(t, torch.Tensor)]


def _phase_of_running_node() -> Tuple[Optional[str], Optional[Dict[Any, Any]], Any]:
    node = torch._C._current_autograd_node()
    if node is None:
        return None, None, None
    with _LOCK:
        found = _ACTIVE.get(node)
    return (found[0], found[1], node) if found is not None else (None, None, node)


# -- Rules 2 and 3: the partition ----------------------------------------------------


class _Partition:
    """The I and W graphs of one backward graph, and how to call them (Rule 3)."""

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
                "compile_backend: the backward graph carries no gradient descriptors (Rule 2 of NOTE "
                f"[ Compiled dx/dw split ]); torch {torch.__version__} is not supported, use a plain backend"))
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
                    "functionalized RNG); such a block cannot be split (Rule 2), compile it with a plain backend"))
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
    """The compiled backward aot_autograd calls: I, W or both by the phase (Rule 4)."""

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
                    stash[node] = ("done", value)  # another group with this seed reads it (Rule 4)
                return self._assemble([], value)
            i_out, kept = self._i(args)  # no split: the whole backward
            return self._assemble(i_out, self._w(args, kept))
        finally:
            args.clear()  # aot_autograd hands its arguments over (steal_args)


def _weights_of(example_inputs: Sequence[Any]) -> Callable[[Any], bool]:
    """Rule 2: whether an aot_autograd input descriptor names a parameter."""
    from torch._functorch._aot_autograd.descriptors import ParamAOTInput, PlainAOTInput

    params = {i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)}

    def is_weight(desc: Any) -> bool:
        if isinstance(desc, ParamAOTInput):
            return True
        return isinstance(desc, PlainAOTInput) and desc.idx in params

    return is_weight


def _no_donated_buffers() -> None:
    """Rule 5: the backward being compiled reuses no saved buffer, and aot_autograd knows it."""
    ctx = torch._guards.TracingContext.try_get()
    if ctx is not None and getattr(ctx, "fw_metadata", None) is not None:
        ctx.fw_metadata.bw_donated_idxs = []


def _split(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], is_weight: Callable[[Any], bool],
           compile_one: Callable[[torch.fx.GraphModule, List[Any], List[int]], Callable],
           static_input_idxs: Sequence[int] = ()) -> _SplitBackward:
    """Rules 3 and 5: partition one backward graph and compile its halves."""
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
            f"{what}: splitting a compiled backward needs torch >= 2.13 (aot_autograd's graph descriptors, "
            f"Rule 6 of NOTE [ Compiled dx/dw split ]); this is torch {torch.__version__}: use a plain "
            "torch.compile backend (I and W then each run the whole compiled backward)"))


def compile_backend(backend: str = "inductor", options: Optional[Dict[str, Any]] = None,
                    saved_ops: Iterable[Any] = ()) -> Callable:
    """A torch.compile backend whose backward I and W split (NOTE [ Compiled dx/dw split ]).

    Args:
        backend: ``"inductor"`` or ``"aot_eager"``: what compiles the forward and the two
            halves of the backward.
        options: inductor config patches (as ``torch.compile(options=...)``); inductor only.
        saved_ops: the ``OpOverload``s a selective policy around the block saves, kept
            dispatched in the forward (Rule 8); inductor only.

    Returns:
        A callable to pass as ``torch.compile(..., backend=)``: the same one for the same
        backend, options and saved ops (blocks compiled one by one share dynamo's compiled
        code).

    Raises:
        CheckpointError: torch older than 2.13, or without torch.compile (Rule 6).
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
            "compile_backend: aot_eager dispatches every op; saved_ops are inductor's (Rule 8)"))

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
        patches = {"donated_buffer": False, "enable_autograd_cache": False}  # Rule 5
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
            for n in g.graph.nodes:  # Rule 8
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
    around it, a selective policy's, sees them (NOTE [ Selective policy ] Rule 5)."""
    if isinstance(backend, str):
        return backend in ("eager", "aot_eager")
    return getattr(backend, "__name__", None) == "hp_recompute_aot_eager"


def split_compile_kwargs(kwargs: Dict[str, Any], saved_ops: Iterable[Any] = ()) -> Dict[str, Any]:
    """Rule 7: the ``torch.compile`` keywords ``kwargs``, with a backend whose backward splits
    (with inductor, keeping ``saved_ops`` dispatched: Rule 8).

    Raises:
        CheckpointError: a mode or options that capture CUDA graphs (Rule 6).
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
            f"compile: mode={mode!r} / options capture CUDA graphs, which would overwrite the stash that W reads "
            "(Rule 6 of NOTE [ Compiled dx/dw split ]); use a mode without CUDA graphs, e.g. "
            "'max-autotune-no-cudagraphs'"))
    saved = saved_ops if backend == "inductor" else ()
    return {**rest, "backend": compile_backend(backend, options=options or None, saved_ops=saved)}
