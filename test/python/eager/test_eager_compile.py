"""torchtitan's compile orders on our checkpoint.

``torch.compile(checkpoint_wrapper(block))`` traces the checkpoint: under a torch.compile
trace ``hp_recompute.checkpoint`` is torch's own non-reentrant checkpoint
(hpr.session.compiled-is-torch). ``checkpoint_wrapper(block).compile()`` compiles the wrapped
block in place and keeps the checkpoint eager (hpr.compiled-split.wrapper-compile). Checked
here: both compute what torch's own wrapper computes under the same compile, the first traces
as one graph (``fullgraph=True``) and is traced again, and refused, inside a collector; the
second hands out handles there; a compiled module whose own frame dynamo skips
(``nn.Sequential``) gets none of our hooks compiled.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn

import hp_recompute as hr

pytestmark = pytest.mark.skipif(not hasattr(torch, "compile") or not hasattr(torch, "compiler"),
                                reason=f"torch {torch.__version__} has no torch.compiler (torch >= 2.1)")


class Block(nn.Module):
    """A pre-norm MLP block with dropout: the RNG must replay bit-identically."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


def _torch_wrapper(block: nn.Module) -> nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    return checkpoint_wrapper(block)


def _step(model: nn.Module, seed: int) -> tuple:
    torch.manual_seed(seed)
    x = torch.randn(4, 16, requires_grad=True)
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach(), x.grad, [p.grad for p in model.parameters()]


def _compiled_pair(backend: str, in_place: bool):
    torch.manual_seed(0)
    ours = hr.checkpoint_wrapper(Block())
    theirs = _torch_wrapper(Block())
    theirs.load_state_dict(ours.state_dict())
    if in_place:
        ours.compile(backend=backend, fullgraph=True)
        theirs.compile(backend=backend, fullgraph=True)
        return ours, theirs
    return torch.compile(ours, backend=backend, fullgraph=True), torch.compile(theirs, backend=backend, fullgraph=True)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("in_place", [False, True], ids=["torch.compile(wrapper)", "wrapper.compile()"])
def test_a_compiled_wrapped_block_matches_torchs_wrapper_under_the_same_compile(backend, in_place):
    torch._dynamo.reset()
    ours, theirs = _compiled_pair(backend, in_place)
    for seed in (1, 2):  # the second call runs the cached graph
        got, want = _step(ours, seed), _step(theirs, seed)
        assert torch.equal(got[0], want[0])
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
        for g, w in zip(got[2], want[2]):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_the_compiled_wrapper_has_no_graph_break():
    torch._dynamo.reset()
    block = hr.checkpoint_wrapper(Block())
    explained = torch._dynamo.explain(block)(torch.randn(4, 16, requires_grad=True))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_graph_traced_outside_a_collector_is_traced_again_and_refused_inside_one(fullgraph):
    """A compiled checkpoint has no handle; inside a collector it must say so, also from the cache.

    Under ``fullgraph=True`` dynamo reports an exception raised while tracing as its own
    ``Unsupported`` error, which carries our message.
    """
    torch._dynamo.reset()
    compiled = torch.compile(hr.checkpoint_wrapper(Block()), backend="aot_eager", fullgraph=fullgraph)
    x = torch.randn(4, 16, requires_grad=True)
    compiled(x).sum().backward()  # traced with no collector open
    with hr.recompute_handle_collector_ctx() as handles:
        with pytest.raises(Exception, match="traced by torch.compile inside recompute_handle_collector_ctx") as info:
            compiled(x)
    assert fullgraph or isinstance(info.value, hr.CheckpointError)
    assert handles == []
    compiled(x).sum().backward()  # the collector closed: the first graph runs again


@pytest.mark.skipif(not hasattr(torch.nn.Module, "compile"), reason="nn.Module.compile needs torch >= 2.2")
@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_wrapper_compiled_in_place_keeps_its_handle_inside_a_collector(fullgraph):
    """``wrapper.compile()`` compiles the block inside the checkpoint: a collector gets the
    handle (where ``torch.compile(wrapper)`` is refused, above), its prefetch fills the
    session with the compiled forward's tensors, and the gradients are torch's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    ours = hr.checkpoint_wrapper(Block())
    theirs = _torch_wrapper(Block())
    theirs.load_state_dict(ours.state_dict())
    ours.compile(backend="aot_eager", fullgraph=fullgraph)
    theirs.compile(backend="aot_eager", fullgraph=fullgraph)
    want = _step(theirs, 3)
    hr.reset_stats()
    torch.manual_seed(3)
    x = torch.randn(4, 16, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = ours(x).square().mean()
    assert len(handles) == 1
    hr.recompute_handle(handles[0], "compiled")
    with hr.recompute_session_ctx("compiled"):
        loss.backward()
    hr.clear_recompute_session("compiled")
    assert hr.stats()["session_replays"] == 1 and hr.stats()["plain_replays"] == 0
    assert torch.equal(loss.detach(), want[0])
    torch.testing.assert_close(x.grad, want[1], rtol=0, atol=0)
    for g, w in zip([p.grad for p in ours.parameters()], want[2]):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.skipif(not hasattr(torch.nn.Module, "compile"), reason="nn.Module.compile needs torch >= 2.2")
def test_our_hooks_are_not_compiled_inside_a_compiled_module_whose_frame_dynamo_skips():
    """``nn.Sequential(...).compile()``: dynamo skips the Sequential's own frame (torch's
    code) and its callback stays installed while the block runs. torch's checkpoint hooks
    are never compiled there; ours must not be either (hpr.session.compiled-is-torch): no graph of them."""
    from torch._dynamo.utils import counters

    for checkpoint in (hr.checkpoint, _torch_checkpoint):
        torch._dynamo.reset()
        counters.clear()
        block = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
        block.compile(backend="aot_eager")
        x = torch.randn(4, 16, requires_grad=True)
        checkpoint(block, x).sum().backward()
        assert counters["stats"].get("unique_graphs", 0) == 0, (checkpoint, dict(counters["stats"]))
        assert x.grad is not None


def _torch_checkpoint(function, *args):
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)


needs_split_and_selective = pytest.mark.skipif(
    not hr.compile_split.SUPPORTED or not hr.selective.selective_supported(),
    reason="needs the compiled dx/dw split (torch >= 2.13) and selective checkpointing")
FUSED = "compile the block with backend=\"aot_eager\", call the op without out=, or checkpoint the region in full"


def _replay_matmuls(run):
    """Runs ``run()`` and counts the matmuls dispatched in replays (below a selective policy's
    mode, which answers a saved one from its cache; a block compiled with aot_eager dispatches
    its ops through the counter too)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hp_recompute.frame import THREAD

    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)

    class Count(TorchDispatchMode):
        n = 0

        @classmethod
        def ignore_compile_internals(cls):
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func in matmuls and THREAD.replay is not None
            return func(*args, **(kwargs or {}))

    with Count():
        run()
    return Count.n


@needs_split_and_selective
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_selective_policy_runs_on_a_block_compiled_with_aot_eager_and_stops_at_inductors_kernels(backend):
    """hpr.selective.visible-ops: around a block compiled with aot_eager the policy
    sees each aten op: the replay reads the matmuls back (none dispatched, where the full
    policy dispatches them) and the gradients are the eager block's; around inductor's fused
    kernels it would save nothing, so its first out= matmul stops the forward."""
    torch.manual_seed(0)
    eager, compiled = Block(), Block()
    compiled.load_state_dict(eager.state_dict())
    compiled.compile(backend=backend)
    torch.manual_seed(1)
    x = torch.randn(4, 16)
    torch.manual_seed(2)  # the same dropout masks in both
    want = hr.checkpoint(eager, x, context_fn=hr.selective_context_fn()).square().sum()
    want.backward()
    if backend == "inductor":
        with pytest.raises(hr.CheckpointError) as err:
            hr.checkpoint(compiled, x, context_fn=hr.selective_context_fn())
        assert "sees aten.addmm.out, an out= call of an op it saves (a compiled kernel's, e.g. inductor's extern " \
            "matmul, or an explicit out=)" in str(err.value) and FUSED in str(err.value), str(err.value)
        return
    for policy in ({}, {"context_fn": hr.selective_context_fn()}):
        compiled.zero_grad(set_to_none=True)

        def step():
            torch.manual_seed(2)
            got = hr.checkpoint(compiled, x, **policy).square().sum()
            got.backward()
            torch.testing.assert_close(got, want)

        assert (_replay_matmuls(step) == 0) == bool(policy), policy
        for p, q in zip(compiled.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


@needs_split_and_selective
def test_a_selective_wrapper_compiles_only_where_the_policy_sees_the_ops_it_saves():
    """hpr.selective.visible-ops at ``compile()``: a wrapper with a context_fn compiles with inductor (the default,
    keeping the ops its policy saves dispatched) and aot_eager; a backend callable, a
    context_fn that is not torch's SAC contexts and a policy that reads its op's arguments are
    refused before anything compiles."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def by_shape(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if args[0].dim() == 2 else CheckpointPolicy.PREFER_RECOMPUTE

    refusals = (
        ({"backend": hr.compile_backend("inductor")}, hr.selective_context_fn(),
         "this checkpoint_wrapper has a context_fn (e.g. a selective policy), whose dispatch modes see the aten ops "
         "its block dispatches"),
        ({}, lambda: (contextlib.nullcontext(), contextlib.nullcontext()),
         "its context_fn returns tuple, not torch's selective checkpoint contexts (create_selective_checkpoint_"
         "contexts), so which ops it saves cannot be read off before the block compiles"),
        ({}, lambda: create_selective_checkpoint_contexts(by_shape),
         "its selective policy raised IndexError (tuple index out of range) when asked about"),
    )
    for kwargs, context_fn, message in refusals:
        wrapper = hr.checkpoint_wrapper(Block(), context_fn=context_fn)
        with pytest.raises(hr.CheckpointError) as err:
            wrapper.compile(**kwargs)
        assert message in str(err.value), str(err.value)
        assert "aot_eager" in str(err.value)
        assert getattr(wrapper._checkpoint_wrapped_module, "_compiled_call_impl", None) is None
    x = torch.randn(4, 16, requires_grad=True)
    for backend, options in (("aot_eager", {"context_fn": hr.selective_context_fn()}), ("inductor", {}),
                             ("inductor", {"context_fn": hr.selective_context_fn()})):
        wrapper = hr.checkpoint_wrapper(Block(), **options)
        wrapper.compile(backend=backend)
        wrapper(x).sum().backward()
        assert all(p.grad is not None for p in wrapper.parameters())


class GatedBlock(nn.Module):
    """Llama's feed-forward block: bias-free projections, so its matmuls dispatch ``aten.mm``."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(width)
        self.w1 = nn.Linear(width, 3 * width, bias=False)
        self.w3 = nn.Linear(width, 3 * width, bias=False)
        self.w2 = nn.Linear(3 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.w2(torch.nn.functional.silu(self.w1(h)) * self.w3(h))


def _torchtitan_context_fn():
    """torchtitan's op-level SAC policy (its own words): save every matmul but every second."""
    import collections

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    meta = collections.defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        to_save = func in (torch.ops.aten.mm.default,) and meta[key] % 2 == 1
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _boolean_context_fn():
    """A policy answering with booleans, which torch reads as MUST_SAVE / PREFER_RECOMPUTE."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(lambda ctx, func, *args, **kwargs: func == torch.ops.aten.mm.default)


@needs_split_and_selective
@pytest.mark.parametrize("policy, block", [("ours", Block), ("ours", GatedBlock), ("torchtitan", GatedBlock),
                                           ("boolean", GatedBlock)])
def test_a_selective_wrapper_compiled_with_inductor_replays_what_its_policy_recomputes(policy, block):
    """hpr.selective.visible-ops, hpr.compiled-split.saved-ops-dispatched: inductor keeps the matmuls the policy
    saves dispatched, so the compiled replay dispatches the matmuls the eager block's replay
    does (none under ours; every second one under torchtitan's) and reads the rest back; the
    outputs and gradients are the eager wrapper's (a matmul output fused over in place, as
    inductor does without hpr.compiled-split.saved-ops-dispatched, fails them)."""
    context_fn = {"ours": hr.selective_context_fn(), "torchtitan": _torchtitan_context_fn,
                  "boolean": _boolean_context_fn}[policy]
    torch.manual_seed(0)
    # eval(): no dropout (inductor draws other masks than eager code); gradients still flow
    eager = hr.checkpoint_wrapper(block(), context_fn=context_fn).eval()
    compiled = hr.checkpoint_wrapper(block(), context_fn=context_fn).eval()
    compiled.load_state_dict(eager.state_dict())
    compiled.compile()
    x = torch.randn(4, 16)
    got = {}
    for name, wrapper in (("eager", eager), ("inductor", compiled)):
        xs = x.clone().requires_grad_()

        def step():
            out = wrapper(xs)
            out.square().sum().backward()
            got[name] = (out.detach(), xs.grad, [p.grad for p in wrapper.parameters()])

        got[name + " replays"] = _replay_matmuls(step)
    want = 1 if policy == "torchtitan" else 0  # torchtitan's saves the first and third of three
    assert got["eager replays"] == got["inductor replays"] == want, got
    torch.testing.assert_close(got["inductor"][:2], got["eager"][:2], rtol=1e-4, atol=1e-5)
    for p, q in zip(got["inductor"][2], got["eager"][2]):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@needs_split_and_selective
@pytest.mark.parametrize("backend", [None, "aot_eager", "inductor"])
def test_a_full_plan_sets_a_selective_wrappers_policy_aside(backend):
    """hpr.selective.plan-full: a region whose wrapper holds a selective policy, planned in full
    (``--checkpoint auto`` under a budget), saves only its input: its replay dispatches the
    matmuls its policy would have saved (eager: w1's and w3's, the replay stops once w2's
    input is back, torch's early stop; compiled: all three, the graph runs whole); planned selective again
    (another plan over the same module) it saves them again (none replayed); the outputs and
    gradients stay the plain block's. A ``context_fn`` that is not a selective policy stays
    refused under a full plan (it may keep what the plan did not price)."""
    pytest.importorskip("torch.distributed.pipelining", reason="needs torch.distributed.pipelining")
    from hp_recompute.errors import RunError
    from hp_recompute.pipelining.regions import checkpoint_regions

    torch.manual_seed(0)
    plain = GatedBlock()
    stage = nn.Module()
    stage.layers = nn.ModuleDict({"0": hr.checkpoint_wrapper(GatedBlock(), context_fn=hr.selective_context_fn())})
    stage.layers["0"].load_state_dict(plain.state_dict())
    if backend is not None:
        stage.layers["0"].compile(backend=backend)
    x = torch.randn(4, 16)
    xs = x.clone().requires_grad_()
    plain(xs).square().sum().backward()
    want = (xs.grad, [p.grad for p in plain.parameters()])
    full = 2 if backend is None else 3
    for selective, replayed in ((), full), (["layers.0"], 0), ((), full):
        checkpoint_regions(stage, ["layers.0"], 1, selective=selective)
        stage.zero_grad(set_to_none=True)
        xs = x.clone().requires_grad_()
        assert _replay_matmuls(lambda: stage.layers["0"](xs).square().sum().backward()) == replayed, selective
        torch.testing.assert_close(xs.grad, want[0], rtol=1e-4, atol=1e-5)
        for p, q in zip(stage.layers["0"].parameters(), want[1]):
            torch.testing.assert_close(p.grad, q, rtol=1e-4, atol=1e-5)

    other = nn.Module()
    other.layers = nn.ModuleDict({"0": hr.checkpoint_wrapper(GatedBlock(), context_fn=contextlib.nullcontext)})
    with pytest.raises(RunError) as error:
        checkpoint_regions(other, ["layers.0"], 1)
    assert str(error.value) == (
        "hp_recompute.pipelining: stage 1: the plan checkpoints region 'layers.0' in full, but its checkpoint_wrapper "
        "has a context_fn that is not a selective policy (torch's create_selective_checkpoint_contexts), which may "
        "keep what the plan did not price; drop the context_fn, or make it a selective policy "
        "[hpr.selective.plan-full]")
