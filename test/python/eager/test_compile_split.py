"""The compiled dx/dw split (NOTE [ Compiled dx/dw split ] in compile_split.py).

A block compiled with ``hp_recompute.compile_backend(...)`` is one autograd node whose
backward is two graphs: I (input gradients) and W (weight gradients). Checked here:
gradients against an eager, unsplit backward; the matmul work of I + W against one
backward of the same block compiled with torch's own backend (torch's profiler, which
sees inductor's extern matmuls too); no donated-buffer error with the global config
untouched; one replay per session feeding I and W; loud refusals.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import hp_recompute as hr
from hp_recompute import compile_split
from hp_recompute.backward_split import SPLIT_SUPPORTED
from hp_recompute.errors import CheckpointError

needs_split = pytest.mark.skipif(
    not compile_split.SUPPORTED,
    reason=f"torch {torch.__version__}: the compiled split needs torch >= 2.13 (hpr.compiled-split.supported); "
           "1.13 has no torch.compile")

REPO = Path(__file__).resolve().parents[3]
TOL = {"aot_eager": 1e-5, "inductor": 1e-4}
DIM, HIDDEN, BATCH = 16, 48, 8


class Block(nn.Module):
    """Pre-norm MLP with a residual: input path x -> norm -> fc1 -> fc2, weights beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def _blocks(n: int, seed: int = 0):
    torch.manual_seed(seed)
    return [Block() for _ in range(n)]


def _copies(blocks):
    out = [Block() for _ in blocks]
    for b, c in zip(blocks, out):
        c.load_state_dict(b.state_dict())
    return out


def _params(blocks):
    return [p for b in blocks for p in b.parameters()]


def _eager_reference(blocks, x0, dy):
    """Gradients of (x, every parameter) from one plain eager backward."""
    ref = _copies(blocks)
    x = x0.clone().requires_grad_()
    h = x
    for b in ref:
        h = b(h)
    return list(torch.autograd.grad(h, [x] + _params(ref), dy))


def _matmul_flops(fn):
    """(matmul FLOPs, result) of ``fn``, from torch's profiler: aten::mm/addmm/bmm, also
    the ones inductor's generated code calls as extern kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        result = fn()
    return sum(e.flops for e in prof.events() if e.name in ("aten::mm", "aten::addmm", "aten::bmm")), result


def _split_step(compiled, blocks, x0, dy):
    """One I and one W over a chain of compiled blocks: (gradients, I FLOPs, W FLOPs)."""
    x = x0.clone().requires_grad_()
    h = x
    for c in compiled:
        h = c(h)
    i_flops, ((dx,), state) = _matmul_flops(lambda: hr.backward_input([h], [dy], [x], _params(blocks)))
    w_flops, dw = _matmul_flops(lambda: hr.backward_weight(state))
    return [dx] + list(dw), i_flops, w_flops


def _one_backward_flops(compiled, x0, dy):
    """Matmul FLOPs of one plain backward, measured on the second call: the first one
    compiles the backward, and compiling traces matmuls too (on fake tensors)."""
    flops = []
    for _ in range(2):
        x = x0.clone().requires_grad_()
        h = x
        for c in compiled:
            h = c(h)
        flops.append(_matmul_flops(lambda: torch.autograd.grad([h], [x] + _params_of(compiled), [dy]))[0])
    return flops[-1]


def _params_of(compiled):
    return [p for c in compiled for p in c.parameters()]


def _assert_close(got, want, tol):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g is not None, i
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=lambda m, i=i: f"gradient {i}: {m}")


@needs_split
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_i_and_w_split_a_compiled_chain_exactly_with_one_backward_of_matmul_work(backend):
    """Two compiled blocks in one stage: the input path runs through both compiled nodes.

    A plain backward (retain_graph=False) runs first, with torch's default
    ``donated_buffer=True``: the split after it must not raise aot_autograd's donated
    buffer error, and the global config stays as it was (hpr.compiled-split.no-donated-buffers).
    """
    torch._dynamo.reset()
    donated = torch._functorch.config.donated_buffer
    blocks = _blocks(2)
    ours = [torch.compile(b, backend=hr.compile_backend(backend)) for b in blocks]
    torch.manual_seed(1)
    x0, dy = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    want = _eager_reference(blocks, x0, dy)

    x = x0.clone().requires_grad_()
    h = ours[1](ours[0](x))
    h.backward(dy)  # compiles the backward; retain_graph=False with donated_buffer=True
    for p in _params(blocks):
        p.grad = None
    for _ in range(2):  # the second step runs the cached graphs
        got, i_flops, w_flops = _split_step(ours, blocks, x0, dy)
        _assert_close(got, want, TOL[backend])
    assert all(p.grad is None for p in _params(blocks))  # W returns the gradients, .grad untouched
    assert torch._functorch.config.donated_buffer == donated
    full_ours = _one_backward_flops(ours, x0, dy)  # the unsplit backward of our backend (hpr.compiled-split.phase)

    theirs = [torch.compile(b, backend=backend) for b in _copies(blocks)]  # torch's own backend
    full = _one_backward_flops(theirs, x0, dy)
    print(f"\n{backend}: matmul FLOPs I {i_flops} + W {w_flops} = {i_flops + w_flops}; one backward {full}")
    assert full > 0 and full_ours == full
    assert 0 < i_flops < full and 0 < w_flops < full
    assert i_flops + w_flops <= 1.05 * full


@needs_split
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torchtitans_order_compiled_checkpoint_wrappers_split_too(backend):
    """``torch.compile(checkpoint_wrapper(block), fullgraph=True)``: the recompute is inside the
    compiled backward graph; the part I and W both need runs once, in I (hpr.compiled-split.partition)."""
    torch._dynamo.reset()
    blocks = _blocks(2)
    ours = [torch.compile(hr.checkpoint_wrapper(b), backend=hr.compile_backend(backend), fullgraph=True)
            for b in blocks]
    torch.manual_seed(4)
    x0, dy = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    _one_backward_flops(ours, x0, dy)  # compiles the backward outside the count
    got, i_flops, w_flops = _split_step(ours, blocks, x0, dy)
    _assert_close(got, _eager_reference(blocks, x0, dy), TOL[backend])
    theirs = [torch.compile(hr.checkpoint_wrapper(b), backend=backend, fullgraph=True) for b in _copies(blocks)]
    full = _one_backward_flops(theirs, x0, dy)  # with the replayed forward's matmuls
    print(f"\n{backend}, compiled checkpoint_wrapper: I {i_flops} + W {w_flops}; one backward {full}")
    assert 0 < w_flops < i_flops and i_flops + w_flops <= 1.05 * full


@needs_split
def test_twelve_wrapped_blocks_compile_with_fullgraph_and_all_split():
    """torchtitan's order on a stage of 12 blocks: ``checkpoint_wrapper(block).compile(
    fullgraph=True)`` one by one. The blocks share one compiled forward (one backend callable
    for one backend): before, each got its own ``compile_backend`` and recompiled the shared
    forward, and the 9th hit dynamo's recompile limit (8), FailOnRecompileLimitHit here, or
    silently ran eagerly without ``fullgraph``. Every block's backward splits: W of the chain
    runs weight-gradient matmuls only, and the gradients are exact."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    blocks = _blocks(12)
    wrapped = [hr.checkpoint_wrapper(b) for b in blocks]
    for w in wrapped:
        w.compile(backend="aot_eager", fullgraph=True)
    torch.manual_seed(4)
    x0, dy = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    with torch._dynamo.config.patch(recompile_limit=8):
        got, i_flops, w_flops = _split_step(wrapped, blocks, x0, dy)
    _assert_close(got, _eager_reference(blocks, x0, dy), TOL["aot_eager"])
    # One graph compiled by aot_autograd (with the split backward) for all 12 blocks.
    assert counters["stats"]["unique_graphs"] == 1 and counters["aot_autograd"]["ok"] == 1, dict(counters)
    # I and W each run their half of the matmuls (measured here: W at most I).
    assert 0 < w_flops <= i_flops, (i_flops, w_flops)
    assert compile_split.compile_backend("aot_eager") is compile_split.compile_backend("aot_eager")


def _gpt_blocks(n: int):
    spec = importlib.util.spec_from_file_location("hpr_gpt_example", REPO / "examples" / "gpt" / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("hpr_gpt_example", module)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return [module.Block(module.DIM, module.HEADS, module.SEQ) for _ in range(n)], module


@needs_split
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_gpt_blocks_with_attention_split_with_one_backward_of_matmul_work(backend):
    """The bundled GPT example's blocks (attention, layer norms, MLP), two per stage."""
    torch._dynamo.reset()
    blocks, gpt = _gpt_blocks(2)
    refs, _ = _gpt_blocks(2)
    for b, r in zip(blocks, refs):
        r.load_state_dict(b.state_dict())
    ours = [torch.compile(b, backend=hr.compile_backend(backend)) for b in blocks]
    torch.manual_seed(5)
    x0, dy = torch.randn(2, gpt.SEQ, gpt.DIM), torch.randn(2, gpt.SEQ, gpt.DIM)
    x = x0.clone().requires_grad_()
    h = x
    for r in refs:
        h = r(h)
    want = list(torch.autograd.grad(h, [x] + _params(refs), dy))
    _one_backward_flops(ours, x0, dy)  # compiles the backward outside the count
    got, i_flops, w_flops = _split_step(ours, blocks, x0, dy)
    _assert_close(got, want, TOL[backend])
    full = _one_backward_flops([torch.compile(r, backend=backend) for r in refs], x0, dy)
    print(f"\n{backend}, 2 GPT blocks: I {i_flops} + W {w_flops}; one backward {full}")
    assert 0 < w_flops < i_flops and i_flops + w_flops <= 1.05 * full


@needs_split
def test_torchs_own_backend_runs_the_whole_compiled_backward_in_i_and_in_w():
    """What the split removes: with a plain backend, I and W each run the compiled node whole."""
    torch._dynamo.reset()
    blocks = _blocks(1)
    plain = [torch.compile(blocks[0], backend="aot_eager")]
    torch.manual_seed(1)
    x0, dy = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    got, i_flops, w_flops = _split_step(plain, blocks, x0, dy)
    _assert_close(got, _eager_reference(blocks, x0, dy), TOL["aot_eager"])
    full = _one_backward_flops(plain, x0, dy)
    assert i_flops == full and w_flops == full


@needs_split
@pytest.mark.parametrize("backend,wrapped,for_weight", [
    ("aot_eager", False, False), ("aot_eager", True, False), ("inductor", False, False), ("inductor", True, False),
    ("aot_eager", True, True)], ids=[
    "aot_eager-checkpoint(block.compile(split backend))", "aot_eager-checkpoint_wrapper(block).compile(backend name)",
    "inductor-checkpoint(block.compile(split backend))", "inductor-checkpoint_wrapper(block).compile(backend name)",
    "aot_eager-wrapper-replayed-for-weight"])
def test_a_checkpointed_compiled_block_replays_once_per_session_for_i_and_w(backend, wrapped, for_weight):
    """Zero-bubble order over two microbatches, the block compiled in place inside the
    checkpoint: by ``block.compile(backend=compile_backend(...))`` in ``hp_recompute.checkpoint``,
    or torchtitan's way, the wrapper's ``compile(backend=name)`` with nothing else set
    (hpr.compiled-split.wrapper-compile). Each session's one replay (a prefetch) feeds I and W, and I + W
    together do one backward's matmuls (the replay's forward is not in them). ``for_weight``: each
    session drops its replay after I and replays again for W (hpr.session.replay-for-weight), exactly."""
    torch._dynamo.reset()
    block = _blocks(1)[0]
    reference = _copies([block])[0]
    if wrapped:
        wrapper = hr.checkpoint_wrapper(block)
        wrapper.compile(backend=backend)
        run = wrapper
    else:
        block.compile(backend=hr.compile_backend(backend))
        run = functools.partial(hr.checkpoint, block)
    block(torch.randn(BATCH, DIM, requires_grad=True)).sum().backward()  # compile outside the count
    block.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    xs = [torch.randn(BATCH, DIM) for _ in range(2)]
    dys = [torch.randn(BATCH, DIM) for _ in range(2)]
    leaves, outs, handles, states, got = {}, {}, {}, {}, {}
    flops = {"I": 0, "W": 0}
    order = "F0 F1 P0 I0 D0 P1 I1 D1 R0 W0 R1 W1" if for_weight else "F0 F1 P0 I0 P1 I1 W0 W1"
    for action in order.split():
        kind, mb = action[0], int(action[1])
        sid = f"compiled.mb{mb}"
        if kind == "F":
            leaves[mb] = xs[mb].clone().requires_grad_()
            with hr.recompute_handle_collector_ctx() as handles[mb]:
                outs[mb] = run(leaves[mb])
        elif kind == "P":
            for handle in handles[mb]:
                hr.recompute_handle(handle, sid)
        elif kind == "D":
            hr.DEFAULT_SCOPE.drop_replay(sid)
        elif kind == "R":
            hr.DEFAULT_SCOPE.replay_for_weight(sid)
        elif kind == "I":
            with hr.recompute_session_ctx(sid, retain_on_unpack=True):
                n, ((dx,), states[mb]) = _matmul_flops(
                    lambda: hr.backward_input([outs[mb]], [dys[mb]], [leaves[mb]], block))
            flops["I"] += n
            got[mb] = [dx]
        else:
            with hr.recompute_session_ctx(sid):
                n, dw = _matmul_flops(lambda: hr.backward_weight(states[mb]))
            flops["W"] += n
            got[mb] += list(dw)
            hr.clear_recompute_session(sid)
    assert len(handles[0]) == 1
    assert hr.stats()["session_replays"] == (4 if for_weight else 2)  # one per microbatch, shared by I and W
    assert hr.stats()["plain_replays"] == 0
    assert hr.live_sessions() == []
    for mb in range(2):
        _assert_close(got[mb], _eager_reference([reference], xs[mb], dys[mb]), TOL[backend])
    full = 2 * _one_backward_flops([torch.compile(_copies([block])[0], backend=backend)], xs[0], dys[0])
    print(f"\n{backend}, checkpoint(block.compile()), 2 sessions: I {flops['I']} + W {flops['W']}; 2 backwards {full}")
    assert 0 < flops["I"] and 0 < flops["W"] and flops["I"] + flops["W"] <= 1.05 * full, (flops, full)


@needs_split
def test_a_stage_without_an_input_path_runs_the_compiled_backward_once_in_w():
    """Stage 0 (no input gradient): I does nothing, W runs the whole compiled backward once."""
    torch._dynamo.reset()
    blocks = _blocks(1)
    ours = torch.compile(blocks[0], backend=hr.compile_backend("aot_eager"))
    torch.manual_seed(3)
    x0, dy = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    y = ours(x0)
    i_flops, (dxs, state) = _matmul_flops(lambda: hr.backward_input([y], [dy], [], blocks[0]))
    w_flops, dw = _matmul_flops(lambda: hr.backward_weight(state))
    assert dxs == () and i_flops == 0
    _assert_close(list(dw), _eager_reference(blocks, x0, dy)[1:], TOL["aot_eager"])
    assert w_flops <= _one_backward_flops([ours], x0.clone().requires_grad_(), dy)


@needs_split
def test_a_weight_tied_across_the_compiled_block_and_eager_code_gets_its_whole_gradient():
    """``fc1.weight`` used inside the compiled block and twice outside it: W's groups reach the
    compiled node as a seed and through the re-walk of hpr.split.rewalk-shared-seeds;
    wherever the node runs without its stash it runs whole, so the gradient is exact."""
    torch._dynamo.reset()
    block = _blocks(1)[0]
    ref = _copies([block])[0]
    ours = torch.compile(block, backend=hr.compile_backend("aot_eager"))
    torch.manual_seed(6)
    x0, dz = torch.randn(BATCH, DIM), torch.randn(BATCH, HIDDEN)

    def stage(fn, blk, x):
        return torch.nn.functional.linear(fn(x), blk.fc1.weight) + torch.nn.functional.linear(x, blk.fc1.weight)

    x = x0.clone().requires_grad_()
    want = list(torch.autograd.grad(stage(ref, ref, x), [x] + list(ref.parameters()), dz))
    for _ in range(2):
        x = x0.clone().requires_grad_()
        (dx,), state = hr.backward_input([stage(ours, block, x)], [dz], [x], block)
        _assert_close([dx] + list(hr.backward_weight(state)), want, TOL["aot_eager"])


@needs_split
def test_the_first_backward_ever_may_be_a_split_one(monkeypatch):
    """aot_autograd compiles the backward lazily, inside the first backward: when that is I,
    I must already register its seeds (hpr.compiled-split.phase), or the first step would run I and W whole."""
    torch._dynamo.reset()
    monkeypatch.setattr(compile_split, "_COMPILERS", {})  # no split backend built yet
    blocks = _blocks(1)
    ours = [torch.compile(blocks[0], backend=hr.compile_backend("aot_eager"))]
    torch.manual_seed(7)
    x0, dy = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    got, i_flops, w_flops = _split_step(ours, blocks, x0, dy)
    _assert_close(got, _eager_reference(blocks, x0, dy), TOL["aot_eager"])
    assert i_flops + w_flops == _one_backward_flops(ours, x0, dy)


@needs_split
def test_a_weight_missed_by_w_is_an_error_not_a_silent_none():
    """hpr.split.no-silent-none holds for compiled blocks: a frozen-then-listed weight is named."""
    torch._dynamo.reset()
    block = _blocks(1)[0]
    ours = torch.compile(block, backend=hr.compile_backend("aot_eager"))
    x = torch.randn(BATCH, DIM, requires_grad=True)
    stray = nn.Parameter(torch.randn(3))
    _, state = hr.backward_input([ours(x)], [torch.randn(BATCH, DIM)], [x], list(block.parameters()) + [stray])
    with pytest.raises(CheckpointError, match="not reached by the graph of the outputs"):
        hr.backward_weight(state)


def test_compile_backend_refuses_unknown_backends_and_old_torch(monkeypatch):
    if not hasattr(torch, "compile"):  # torch 1.13
        with pytest.raises(CheckpointError, match="has no torch.compile"):
            hr.compile_backend("inductor")
        return
    with pytest.raises(ValueError, match="backend must be one of"):
        hr.compile_backend("eager")
    with pytest.raises(ValueError, match="options are inductor config patches"):
        hr.compile_backend("aot_eager", options={"max_autotune": True})
    monkeypatch.setattr(compile_split, "SUPPORTED", False)
    with pytest.raises(CheckpointError, match="needs torch >= 2.13"):
        hr.compile_backend("inductor")


def test_a_wrappers_compile_refuses_what_it_cannot_split_and_old_torch():
    """hpr.compiled-split.wrapper-compile: CUDA graphs would overwrite the stash (hpr.compiled-split.supported); an
    inductor mode means nothing to aot_eager."""
    wrapper = hr.checkpoint_wrapper(Block())
    if not hasattr(torch, "compile"):  # torch 1.13
        with pytest.raises(CheckpointError, match="has no torch.compile"):
            wrapper.compile()
        return
    if not compile_split.SUPPORTED:
        pytest.skip(f"torch {torch.__version__} compiles as given (hpr.compiled-split.wrapper-compile)")
    with pytest.raises(CheckpointError, match="capture CUDA graphs, which would overwrite the stash"):
        wrapper.compile(mode="reduce-overhead")
    with pytest.raises(CheckpointError, match="capture CUDA graphs"):
        wrapper.compile(options={"triton.cudagraphs": True})
    with pytest.raises(ValueError, match="is an inductor mode; backend 'aot_eager' takes none"):
        wrapper.compile(backend="aot_eager", mode="max-autotune")
    assert wrapper._checkpoint_wrapped_module._compiled_call_impl is None  # nothing compiled by a refusal


# -- Found by a hostile trial: each was silently wrong, or loud where eager blocks ran ---------


class _PositionBlock(Block):
    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return super().forward(x + pos)


class _Positional(nn.Module):
    """A parameter ``E`` enters the compiled block as a slice ``E[:BATCH]`` (a non-parameter
    input of the compiled graph), and, with ``twice``, is also read directly on another branch."""

    def __init__(self, twice: bool) -> None:
        super().__init__()
        self.twice = twice
        self.E = nn.Parameter(torch.randn(DIM, DIM))
        self.blk = _PositionBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blk(x, self.E[:BATCH])
        return h + x @ self.E.T if self.twice else h


def _split_against_plain(stage: nn.Module, reference: nn.Module, x0: torch.Tensor, dy: torch.Tensor,
                         as_input: bool = False) -> None:
    """I and W of ``stage`` (its block compiled in place inside our wrapper) against one plain backward."""
    x = nn.Parameter(x0.clone()) if as_input else x0.clone().requires_grad_()
    (dx,), state = hr.backward_input([stage(x)], [dy], [x], stage)
    got = [dx] + list(hr.backward_weight(state))
    xr = x0.clone().requires_grad_()
    _assert_close(got, list(torch.autograd.grad(reference(xr), [xr] + list(reference.parameters()), dy)), 1e-5)


@needs_split
@pytest.mark.parametrize("twice", [False, True], ids=["only-through-the-slice", "also-read-directly"])
def test_a_parameter_reaching_a_compiled_block_through_another_tensor_gets_its_whole_gradient(twice):
    """hpr.split.compiled-blocks: W of a compiled block gives its parameter inputs only, so
    a seed whose input leads to a weight through other nodes runs whole. Before, the slice's
    share of dE was lost: partial and silent with ``twice``, a misleading error without."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    stage = _Positional(twice)
    reference = _Positional(twice)
    reference.load_state_dict(stage.state_dict())
    stage.blk = hr.checkpoint_wrapper(stage.blk)
    stage.blk.compile(backend="aot_eager")
    torch.manual_seed(1)
    _split_against_plain(stage, reference, torch.randn(BATCH, DIM), torch.randn(BATCH, DIM))


@needs_split
def test_a_parameter_given_as_the_stage_input_gets_its_input_gradient_from_i():
    """A learned input (an ``nn.Parameter`` passed as the stage input) is a W output of the
    compiled graph; I must still return its gradient, not None (hpr.split.compiled-blocks)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block()
    reference = _copies([block])[0]
    stage = hr.checkpoint_wrapper(block)
    stage.compile(backend="aot_eager")
    torch.manual_seed(1)
    _split_against_plain(stage, reference, torch.randn(BATCH, DIM), torch.randn(BATCH, DIM), as_input=True)


class _Tied(nn.Module):
    """Two blocks in series whose first layers share one weight: W has two groups that both
    read the first block's checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.blocks[1].fc1.weight = self.blocks[0].fc1.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[1](self.blocks[0](x))


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=needs_split)], ids=["eager", "compiled"])
def test_w_in_a_session_that_drops_what_it_reads_serves_every_group(compiled):
    """hpr.split.seed-groups: W's groups read one session; every call but the last
    retains, so W as the last consumer (``retain_on_unpack=False``, as a plan's W) works with
    tied weights. Before, the second group found the tensors consumed (a loud error that the
    caller of PlannedSchedule could not act on)."""
    if compiled:
        torch._dynamo.reset()
    torch.manual_seed(0)
    stage, reference = _Tied(), _Tied()
    reference.load_state_dict(stage.state_dict())
    for i, b in enumerate(stage.blocks):
        stage.blocks[i] = hr.checkpoint_wrapper(b)
        if compiled:
            stage.blocks[i].compile(backend="aot_eager")
    torch.manual_seed(1)
    x0, dy = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    x = x0.clone().requires_grad_()
    with hr.recompute_handle_collector_ctx() as handles:
        y = stage(x)
    for h in handles:
        hr.recompute_handle(h, "tied")
    with hr.recompute_session_ctx("tied", retain_on_unpack=True):
        (dx,), state = hr.backward_input([y], [dy], [x], stage)
    assert len(state.groups) > 1 or not SPLIT_SUPPORTED  # torch 1.13: one re-walk (hpr.split.rewalk-old-torch)
    with hr.recompute_session_ctx("tied"):
        got = [dx] + list(hr.backward_weight(state))
    hr.clear_recompute_session("tied")
    xr = x0.clone().requires_grad_()
    _assert_close(got, list(torch.autograd.grad(reference(xr), [xr] + list(reference.parameters()), dy)), 1e-5)


class _Flattening(Block):
    """Flattens (batch, sequence) before its layers: symbolic sizes multiply under dynamic shapes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return super().forward(x.reshape(b * t, d)).view(b, t, d)


@needs_split
def test_inductor_with_dynamic_shapes_splits_after_a_second_sequence_length():
    """A second shape makes dynamo recompile with symbolic sizes; W must bind them too
    (hpr.compiled-split.partition). Before: InductorError on the backward."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = _Flattening()
    reference = _Flattening()
    reference.load_state_dict(block.state_dict())
    wrapped = hr.checkpoint_wrapper(block)
    wrapped.compile()  # inductor, dynamic=None: automatic dynamic shapes on the second length
    for seq in (4, 6, 7):
        torch.manual_seed(seq)
        x0, dy = torch.randn(2, seq, DIM), torch.randn(2, seq, DIM)
        _split_against_plain(wrapped, reference, x0, dy)
