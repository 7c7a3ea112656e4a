"""hp_recompute.checkpoint without sessions: numerics, options, contexts, compatibility with torch."""

import contextlib
import sys
import types

import pytest
import torch
import torch.utils.checkpoint as torch_cp

import hp_recompute as hr
from hpr_eager_util import PER_GRAPH_TASK, Counted, assert_bit_equal, make_blocks, native_checkpoint, params_of


def _loss_and_grads(run, x, params):
    loss = run(x).pow(2).sum()
    return loss.detach(), torch.autograd.grad(loss, [x] + params)


def test_gradients_equal_plain_autograd(device):
    blocks = make_blocks(2, 6, 11, device)
    params = params_of(blocks)
    x = torch.randn(4, 6, device=device, requires_grad=True)
    plain = _loss_and_grads(lambda t: blocks[1](blocks[0](t)), x, params)
    ours = _loss_and_grads(lambda t: hr.checkpoint(blocks[1], hr.checkpoint(blocks[0], t)), x, params)
    assert torch.equal(plain[0], ours[0])
    assert_bit_equal(ours[1], plain[1])


def test_kwargs_reach_function(device):
    seen = {}

    def fn(x, *, scale, shift=0.0):
        seen["scale"], seen["shift"] = scale, shift
        return (x * scale + shift).sin()

    x = torch.randn(3, device=device, requires_grad=True)
    y = hr.checkpoint(fn, x, scale=3.0, shift=0.5)
    assert seen == {"scale": 3.0, "shift": 0.5}
    (g,) = torch.autograd.grad(y.sum(), [x])
    assert torch.equal(g, (torch.cos(x * 3.0 + 0.5) * 3.0).detach())


@pytest.mark.parametrize("early_stop", [True, False])
def test_early_stop_controls_how_far_the_replay_runs(device, early_stop):
    # The last op saves nothing (add of a constant), so an early-stopped replay never
    # returns from the function: entries count, completions do not.
    fn = Counted(lambda x: torch.sin(x).exp() + 1.0)
    x = torch.randn(5, device=device, requires_grad=True)
    y = hr.checkpoint(fn, x, early_stop=early_stop)
    (g,) = torch.autograd.grad(y.sum(), [x])
    assert fn.calls == 2
    assert fn.completions == (1 if early_stop else 2)
    assert torch.allclose(g, torch.cos(x) * torch.sin(x).exp())


def test_dropout_bit_exact_with_rng_preserved(device):
    blocks = make_blocks(2, 8, 13, device, p=0.5)
    params = params_of(blocks)
    x = torch.randn(6, 8, device=device, requires_grad=True)
    torch.manual_seed(7)
    plain = _loss_and_grads(lambda t: blocks[1](blocks[0](t)), x, params)
    after_plain = torch.rand(4, device=device)
    torch.manual_seed(7)
    ours = _loss_and_grads(lambda t: hr.checkpoint(blocks[1], hr.checkpoint(blocks[0], t)), x, params)
    # The replays restored the RNG: the caller's stream continues exactly as without checkpoint.
    assert torch.equal(torch.rand(4, device=device), after_plain)
    assert torch.equal(plain[0], ours[0])
    assert_bit_equal(ours[1], plain[1])


def test_preserve_rng_state_false_redraws_dropout(device):
    blocks = make_blocks(1, 8, 64, device, p=0.5)
    x = torch.randn(16, 8, device=device, requires_grad=True)
    torch.manual_seed(3)
    y_plain = blocks[0](x)
    (g_plain,) = torch.autograd.grad(y_plain.sum(), [x])
    torch.manual_seed(3)
    y = hr.checkpoint(blocks[0], x, preserve_rng_state=False)
    assert torch.equal(y, y_plain)  # same forward
    (g,) = torch.autograd.grad(y.sum(), [x])
    assert not torch.equal(g, g_plain)  # the replay drew a different mask


def test_forward_and_recompute_contexts_run_in_order(device):
    log = []

    class Tag:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            log.append(self.name + ":enter")

        def __exit__(self, *exc):
            log.append(self.name + ":exit")

    def fn(x):
        log.append("fn")
        return x.sin()

    x = torch.randn(3, device=device, requires_grad=True)
    y = hr.checkpoint(fn, x, context_fn=lambda: (Tag("fwd"), Tag("rec")))
    assert log == ["fwd:enter", "fn", "fwd:exit"]
    torch.autograd.grad(y.sum(), [x])
    assert log == ["fwd:enter", "fn", "fwd:exit", "rec:enter", "fn", "rec:exit"]


def test_no_handle_under_no_grad(device):
    fn = Counted(lambda x: x.sin())
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles, torch.no_grad():
        y = hr.checkpoint(fn, x)
    assert handles == [] and fn.calls == 1 and not y.requires_grad


def test_failing_forward_leaves_no_handle(device):
    def boom(x):
        x.sin()
        raise KeyError("forward failed")

    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        with pytest.raises(KeyError, match="forward failed"):
            hr.checkpoint(boom, x)
        y = hr.checkpoint(torch.sin, x)
    assert len(handles) == 1 and isinstance(handles[0], hr.RecomputeHandle)
    assert "sin" in repr(handles[0])
    del y


def test_collector_collects_in_forward_order_and_innermost_only(device):
    x = torch.randn(3, device=device, requires_grad=True)
    first = Counted(torch.sin)
    second = Counted(torch.cos)
    with hr.recompute_handle_collector_ctx() as outer:
        a = hr.checkpoint(first, x)
        with hr.recompute_handle_collector_ctx() as inner:
            b = hr.checkpoint(second, a)
    assert len(outer) == 1 and len(inner) == 1
    assert "sin" in repr(outer[0]) and "cos" in repr(inner[0])
    del b


def _pair():
    return contextlib.nullcontext(), contextlib.nullcontext()


def _option_id(options: dict) -> str:
    """A test id that is the same in every process (pytest -n): functions by name, not address."""
    return ",".join(f"{k}={getattr(v, '__name__', None) or repr(v)}" if callable(v) else f"{k}={v!r}"
                     for k, v in options.items())


@pytest.mark.skipif(not PER_GRAPH_TASK, reason=f"torch {torch.__version__}'s checkpoint lacks these options (2.1)")
@pytest.mark.parametrize(
    "options",
    [
        {"determinism_check": "strict"},
        {"early_stop": 1},
        {"early_stop": None},
        {"preserve_rng_state": "yes"},
        {"preserve_rng_state": 0},
        {"debug": 0},
        {"context_fn": 3},
        {"context_fn": lambda: None},
        {"context_fn": lambda: (1, 2, 3)},
        {"debug": True, "context_fn": _pair},
        {"debug": True, "determinism_check": "strict", "context_fn": _pair},
        {"use_reentrant": True, "context_fn": _pair},
        {"use_reentrant": True, "debug": True},
    ],
    ids=_option_id,
)
def test_options_are_read_and_refused_as_torch_reads_them(device, options):
    """Accepted where torch accepts them (truth values), refused where it refuses, with the
    same exception type and message."""

    def run(impl):
        x = torch.linspace(-1, 1, 3, device=device, requires_grad=True)
        try:
            y = impl(torch.sin, x, **{"use_reentrant": False, **options})
        except (TypeError, ValueError) as e:
            return type(e), str(e)
        y.sum().backward()
        return "ok", x.grad

    ours, torchs = run(hr.checkpoint), run(torch_cp.checkpoint)
    assert ours[0] == torchs[0], (ours, torchs)
    if ours[0] == "ok":
        assert torch.equal(ours[1], torchs[1])
    else:
        assert ours[1] == torchs[1]


def test_an_unknown_determinism_check_is_refused_on_every_torch(device):
    x = torch.randn(3, device=device, requires_grad=True)
    with pytest.raises(ValueError, match=r"^determinism_check should be one of \['default', 'none'\], but got strict$"):
        hr.checkpoint(torch.sin, x, determinism_check="strict")


def test_use_reentrant_none_is_torchs_default_with_torchs_warning(device):
    fn = Counted(lambda x: x.sin() * 2)
    x = torch.randn(3, device=device, requires_grad=True)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed explicitly") \
            if PER_GRAPH_TASK else contextlib.nullcontext():
        y = hr.checkpoint(fn, x, use_reentrant=None)
    # torch 2.x: None is the reentrant variant; torch 1.13 reads it as false
    assert ("CheckpointFunction" in type(y.grad_fn).__name__) == PER_GRAPH_TASK
    y.sum().backward()
    assert fn.calls == 2 and torch.allclose(x.grad, 2 * torch.cos(x))


def test_use_reentrant_true_delegates_to_torch(device):
    fn = Counted(lambda x: x.sin() * 2)
    x = torch.randn(3, device=device, requires_grad=True)
    y = hr.checkpoint(fn, x, use_reentrant=True)
    assert "CheckpointFunction" in type(y.grad_fn).__name__
    y.sum().backward()
    assert fn.calls == 2 and torch.allclose(x.grad, 2 * torch.cos(x))
    with hr.recompute_handle_collector_ctx():
        with pytest.raises(hr.CheckpointError, match="use_reentrant=True cannot produce a recompute handle"):
            hr.checkpoint(fn, x, use_reentrant=True)


def _run_split(impl, device, seed, dx_then_dw):
    """One forward through two checkpointed blocks, then either one backward or dx then dw."""
    blocks = make_blocks(2, 5, 9, device, p=0.3, seed=seed)
    params = params_of(blocks)
    counted = [Counted(b) for b in blocks]
    torch.manual_seed(seed + 1)
    x = torch.randn(3, 5, device=device, requires_grad=True)
    loss = impl(counted[1], impl(counted[0], x)).pow(2).sum()
    if dx_then_dw:
        grads = torch.autograd.grad(loss, [x], retain_graph=True) + torch.autograd.grad(loss, params)
    else:
        grads = torch.autograd.grad(loss, [x] + params)
    return [c.calls for c in counted], grads, loss.detach()


@pytest.mark.parametrize("dx_then_dw", [False, True])
def test_outside_sessions_matches_installed_torch_checkpoint(device, dx_then_dw):
    native_calls, native_grads, native_loss = _run_split(native_checkpoint, device, 11, dx_then_dw)
    ours_calls, ours_grads, ours_loss = _run_split(hr.checkpoint, device, 11, dx_then_dw)
    assert ours_calls == native_calls
    assert torch.equal(ours_loss, native_loss)
    assert_bit_equal(ours_grads, native_grads)


def test_without_session_dx_then_dw_replays_per_backward_like_torch(device):
    # torch 2.x replays once per backward (2 replays); torch 1.13 shares one replay.
    calls, _, _ = _run_split(hr.checkpoint, device, 5, dx_then_dw=True)
    assert calls == ([3, 3] if PER_GRAPH_TASK else [2, 2])
    assert hr.stats()["plain_replays"] == (4 if PER_GRAPH_TASK else 2)


def test_retained_graph_second_backward_matches_torch(device):
    def run(impl):
        fn = Counted(lambda t: t.sin().exp())
        x = torch.arange(4.0, device=device, requires_grad=True)
        y = impl(fn, x).sum()
        g1 = torch.autograd.grad(y, [x], retain_graph=True)
        g2 = torch.autograd.grad(y, [x])
        return fn.calls, g1 + g2

    native_calls, native_grads = run(native_checkpoint)
    ours_calls, ours_grads = run(hr.checkpoint)
    assert ours_calls == native_calls
    assert_bit_equal(ours_grads, native_grads)


def test_autocast_state_is_restored_for_the_replay(device):
    device_type = device.type
    dtype = torch.bfloat16 if device_type == "cpu" else torch.float16
    lin = torch.nn.Linear(8, 8).to(device)
    x = torch.randn(4, 8, device=device, requires_grad=True)

    def fn(t):
        return torch.relu(lin(t)).float().sin()

    with torch.autocast(device_type, dtype=dtype):
        y_plain = fn(x)
    plain = torch.autograd.grad(y_plain.sum(), [x] + list(lin.parameters()))
    with torch.autocast(device_type, dtype=dtype):
        y = hr.checkpoint(fn, x)
    # The backward (and so the replay) runs outside autocast: the frame must re-enter it,
    # otherwise the metadata check would see float32 where the forward saved low precision.
    ours = torch.autograd.grad(y.sum(), [x] + list(lin.parameters()))
    assert_bit_equal(ours, plain)


def _dtype_flipping_function(state):
    def fn(x):
        h = x.to(state["dtype"]) * 2
        return h.sin().float()

    return fn


def test_dtype_change_during_recompute_raises(device):
    state = {"dtype": torch.float32}
    x = torch.randn(3, device=device, requires_grad=True)
    y = hr.checkpoint(_dtype_flipping_function(state), x)
    state["dtype"] = torch.float64
    with pytest.raises(RuntimeError, match=r"(?s)torch\.utils\.checkpoint: Recomputed values for the following tensors have different "
                       r"metadata .*saved metadata: .*torch\.float32.*\nrecomputed metadata: .*torch\.float64"):
        torch.autograd.grad(y.sum(), [x])


def test_dtype_change_found_by_prefetch_raises_checkpoint_error(device):
    state = {"dtype": torch.float32}
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(_dtype_flipping_function(state), x)
    state["dtype"] = torch.float64
    with pytest.raises(hr.CheckpointError, match="(?s)^hp_recompute: .*tensors have different metadata.*pass determinism_check='none'"):
        hr.recompute_handle(handles[0], "dtype")
    del y


def test_determinism_check_none_allows_metadata_change(device):
    state = {"dtype": torch.float32}
    x = torch.randn(3, device=device, requires_grad=True)
    y = hr.checkpoint(_dtype_flipping_function(state), x, determinism_check="none")
    state["dtype"] = torch.float64
    (g,) = torch.autograd.grad(y.sum(), [x])
    assert torch.allclose(g, 2 * torch.cos(2 * x))


def _work_switch(state):
    def fn(x):
        h = x.sin()
        if state["extra"]:
            h = h.exp()
        return h.cos()

    return fn


def test_replay_saving_more_tensors_raises_even_without_metadata_check(device):
    state = {"extra": False}
    x = torch.randn(3, device=device, requires_grad=True)
    y = hr.checkpoint(_work_switch(state), x, determinism_check="none", early_stop=False)
    state["extra"] = True
    with pytest.raises(RuntimeError, match="torch.utils.checkpoint: trying to save more tensors during recomputation"):
        torch.autograd.grad(y.sum(), [x])


def test_replay_saving_fewer_tensors_raises_even_without_metadata_check(device):
    state = {"extra": True}
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(_work_switch(state), x, determinism_check="none")
    state["extra"] = False
    with pytest.raises(hr.CheckpointError, match="(?s)A different number of tensors was saved.*during forward: 3\nNumber of tensors saved during "
                       "recomputation: 2"):
        hr.recompute_handle(handles[0], "fewer")
    assert hr.live_sessions() == []  # a failed prefetch leaves no session it created
    state["extra"] = True
    (g,) = torch.autograd.grad(y.sum(), [x])  # the frame still serves a plain backward
    assert torch.allclose(g, -torch.sin(torch.sin(x).exp()) * torch.sin(x).exp() * torch.cos(x))


def _in_place_first_block(w):
    def block(x):
        x = torch.relu_(x)  # nn.ReLU(inplace=True) as the first layer of a block
        return (x @ w).sin()

    return block


@pytest.mark.parametrize("scheduled", [False, True], ids=["plain", "session"])
def test_block_starting_in_place_on_its_input_is_refused_not_replayed_twice(device, scheduled):
    """A block that changes its input in place cannot be replayed on that input.

    torch 1.13 replays it on the changed input (wrong gradients unless the op is
    idempotent), torch 2.x refuses it through its saved inputs; we refuse it on both,
    before the replay runs, so the input is changed exactly once.
    """
    torch.manual_seed(0)
    w = torch.randn(4, 4, device=device, requires_grad=True)
    a = torch.randn(3, 4, device=device, requires_grad=True)
    x = a * 1.0  # a non-leaf that requires grad
    block = Counted(_in_place_first_block(w))
    with hr.recompute_handle_collector_ctx() as handles:
        loss = hr.checkpoint(block, x).sum()
    after_forward = x.detach().clone()
    with pytest.raises(RuntimeError, match=r"argument #0 of checkpoint .* was modified in place .* clone it"):
        if scheduled:
            hr.recompute_handle(handles[0], "inplace")
        else:
            torch.autograd.grad(loss, [a, w])
    assert block.calls == 1  # no replay ran
    assert torch.equal(x.detach(), after_forward)
    assert hr.live_sessions() == []


@pytest.mark.parametrize("collecting", [True, False])
@pytest.mark.parametrize("tracing", [True, False])
def test_compile_probe_falls_back_to_torch_dynamo(device, monkeypatch, tracing, collecting):
    """torch 2.0-2.2 lack torch.compiler.is_compiling; torch._dynamo.is_compiling tells a trace.

    Under a trace the call goes to torch's own checkpoint, which has no handle: inside a
    collector that is an error, never a silently empty collection.
    """
    fake = types.ModuleType("torch._dynamo")
    fake.is_compiling = lambda: tracing
    monkeypatch.setitem(sys.modules, "torch._dynamo", fake)
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        monkeypatch.delattr(compiler, "is_compiling")
    delegated = []

    def torch_checkpoint(fn, *args, **kwargs):
        delegated.append(kwargs)
        return fn(*args)

    monkeypatch.setattr(torch_cp, "checkpoint", torch_checkpoint)
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() if collecting else contextlib.nullcontext([]) as handles:
        if tracing and collecting:
            with pytest.raises(hr.CheckpointError, match="traced by torch.compile inside recompute_handle_collector"):
                hr.checkpoint(torch.sin, x)
        else:
            hr.checkpoint(torch.sin, x)
    if tracing:
        assert [k["use_reentrant"] for k in delegated] == ([] if collecting else [False]) and handles == []
    else:
        assert delegated == [] and len(handles) == (1 if collecting else 0)
