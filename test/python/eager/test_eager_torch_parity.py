"""Outside sessions hp_recompute.checkpoint is the installed torch's checkpoint(use_reentrant=False).

Each test runs the same program through torch's checkpoint and ours and compares what
a user sees: results, gradients, how often the function runs, which errors are raised.
Where torch 1.13 lacks a feature the test is skipped with the version that added it;
where 1.13 behaves differently on purpose the test asserts 1.13's behaviour.
"""

import logging

import pytest
import torch
import torch.utils.checkpoint as torch_cp

import hp_recompute as hr
from hpr_eager_util import PER_GRAPH_TASK, Counted, assert_bit_equal, native_checkpoint

TORCH = torch.__version__
needs_graph_exec_group = pytest.mark.skipif(
    not hasattr(torch_cp, "GraphExecGroup"), reason=f"torch {TORCH} has no GraphExecGroup (torch >= 2.10)"
)
needs_torch2 = pytest.mark.skipif(not PER_GRAPH_TASK, reason=f"torch {TORCH} lacks it (torch >= 2.1)")


def _outcome(thunk):
    """('ok', value) or (exception type, message) of ``thunk()``."""
    try:
        return "ok", thunk()
    except RuntimeError as e:
        return type(e), str(e)


# -- in-place changes of inputs ------------------------------------------------------------


@pytest.mark.parametrize("when", ["inside", "after"])
def test_input_changed_in_place_never_gives_silent_wrong_gradients(device, when):
    """``x.mul_(2)`` inside the block (or on the input after the forward) is refused.

    torch 2.x refuses it (its saved inputs check their version); torch 1.13 replays on
    the changed input and returns wrong dW, which the reference shows.
    """
    w = torch.randn(4, 4, device=device, requires_grad=True)

    def block(a):
        if when == "inside":
            a.mul_(2)
        return (a @ w).sin().sum()

    def run(impl):
        torch.manual_seed(0)
        x = torch.randn(2, 4, device=device, requires_grad=True) * 1.0
        loss = impl(block, x)
        if when == "after":
            x.mul_(1)  # a version bump only: values unchanged, still refused by torch 2.x
        return torch.autograd.grad(loss, [w])[0]

    ours = _outcome(lambda: run(hr.checkpoint))
    # torch 1.13 turns errors raised in autograd hooks into RuntimeError with our text
    assert ours[0] is (hr.CheckpointError if PER_GRAPH_TASK else RuntimeError)
    assert "hp_recompute: argument #0" in ours[1] and "modified in place" in ours[1] and "clone it" in ours[1]
    native = _outcome(lambda: run(native_checkpoint))
    if PER_GRAPH_TASK:
        assert native[0] is RuntimeError and "modified by an inplace operation" in native[1]
    elif when == "inside":
        torch.manual_seed(0)
        x = torch.randn(2, 4, device=device, requires_grad=True) * 1.0
        (want,) = torch.autograd.grad(block(x), [w])
        assert native[0] == "ok" and not torch.allclose(native[1], want)  # 1.13: silently wrong


# -- backward inside the checkpointed function ------------------------------------------


def _grad_inside(a):
    with torch.enable_grad():
        b = a.sin() * 2
        (g,) = torch.autograd.grad(b.sum(), a, create_graph=True)
    return (g * a).pow(2).sum()


@pytest.mark.parametrize("early_stop", [True, False])
def test_backward_inside_the_checkpointed_function(device, early_stop):
    x0 = torch.randn(3, 4, device=device)
    x = x0.clone().requires_grad_()
    (want,) = torch.autograd.grad(_grad_inside(x), [x])
    x = x0.clone().requires_grad_()
    (got,) = torch.autograd.grad(hr.checkpoint(_grad_inside, x, early_stop=early_stop), [x])
    assert torch.allclose(got, want)
    if PER_GRAPH_TASK:  # torch 1.13's own checkpoint fails here ("never exposed")
        x = x0.clone().requires_grad_()
        (native,) = torch.autograd.grad(native_checkpoint(_grad_inside, x, early_stop=early_stop), [x])
        assert_bit_equal([got], [native])


# -- GraphExecGroup -------------------------------------------------------------------------


def _dx_then_dw(impl, device, group):
    torch.manual_seed(3)
    lin = torch.nn.Linear(5, 5).to(device)
    fn = Counted(lambda a: torch.tanh(lin(a)))
    x = torch.randn(2, 5, device=device, requires_grad=True)
    h = x * 1.0
    loss = impl(fn, h).sum()
    with torch_cp.GraphExecGroup() if group else torch.enable_grad():
        dx = torch.autograd.grad(loss, [h], retain_graph=True)
        dw = torch.autograd.grad(loss, list(lin.parameters()))
    return fn.calls, list(dx) + list(dw)


@needs_graph_exec_group
def test_graph_exec_group_overlapping_backwards_fail_as_in_torch(device):
    """dx and dw read the same saved tensors: torch forbids that inside one group."""
    native = _outcome(lambda: _dx_then_dw(native_checkpoint, device, group=True))
    ours = _outcome(lambda: _dx_then_dw(hr.checkpoint, device, group=True))
    assert issubclass(native[0], torch_cp.CheckpointError) and "already unpacked once" in native[1]
    assert issubclass(ours[0], torch_cp.CheckpointError) and "already unpacked once" in ours[1]
    assert "GraphExecGroup" in ours[1]


@needs_graph_exec_group
def test_graph_exec_group_shares_one_replay_across_disjoint_backwards(device):
    def run(impl):
        torch.manual_seed(4)
        w1 = torch.randn(4, 4, device=device, requires_grad=True)
        w2 = torch.randn(4, 4, device=device, requires_grad=True)
        fn = Counted(lambda a: ((a @ w1).sin().sum(), (a @ w2).cos().sum()))
        x = torch.randn(3, 4, device=device, requires_grad=True)
        l1, l2 = impl(fn, x)
        with torch_cp.GraphExecGroup():
            g1 = torch.autograd.grad(l1, [w1])
            g2 = torch.autograd.grad(l2, [w2])
        return fn.calls, g1 + g2

    native_calls, native_grads = run(native_checkpoint)
    ours_calls, ours_grads = run(hr.checkpoint)
    assert native_calls == ours_calls == 2  # forward and one replay shared by both backwards
    assert_bit_equal(ours_grads, native_grads)


@needs_graph_exec_group
def test_a_session_takes_precedence_over_an_open_graph_exec_group(device):
    """Inside recompute sessions, dx and dw may read the same tensors: retain_on_unpack says so."""
    torch.manual_seed(5)
    lin = torch.nn.Linear(5, 5).to(device)
    fn = Counted(lambda a: torch.tanh(lin(a)))
    h = torch.randn(2, 5, device=device, requires_grad=True) * 1.0
    loss = hr.checkpoint(fn, h).sum()
    with torch_cp.GraphExecGroup():
        with hr.recompute_session_ctx("g", retain_on_unpack=True):
            torch.autograd.grad(loss, [h], retain_graph=True)
        with hr.recompute_session_ctx("g"):
            torch.autograd.grad(loss, list(lin.parameters()))
    hr.clear_recompute_session("g")
    assert fn.calls == 2


# -- keyword arguments and torch's global switches -----------------------------------------


def test_torch_keyword_arguments_never_reach_the_function(device):
    seen = {}

    def fn(a, **kwargs):
        seen.update(kwargs)
        return a.sin()

    x = torch.randn(3, device=device, requires_grad=True)
    y = hr.checkpoint(
        fn, x, use_reentrant=False, debug=False, preserve_rng_state=False, determinism_check="none", early_stop=False,
        context_fn=None, scale=2,
    )
    y.sum().backward()
    assert seen == {"scale": 2}


@needs_torch2
@pytest.mark.parametrize("enable", [True, False])
def test_set_checkpoint_early_stop_overrides_the_argument(device, enable):
    def run(impl):
        fn = Counted(lambda a: a.sin().exp() + 1.0)
        x = torch.randn(4, device=device, requires_grad=True)
        with torch_cp.set_checkpoint_early_stop(enable):
            y = impl(fn, x, early_stop=not enable)
        y.sum().backward()
        return fn.completions

    assert run(hr.checkpoint) == run(native_checkpoint) == (1 if enable else 2)


def _shape_switch(state):
    def fn(a):
        return a.sin() if state["first"] else a[:2].sin()

    return fn


@needs_torch2
@pytest.mark.parametrize("how", ["argument", "global"])
def test_debug_reports_the_operators_of_forward_and_replay(device, how, monkeypatch):
    # torch's debug mode logs operators through the "LoggingTensor" logger with extra
    # record args; pytest's log capture on the root logger cannot format those records.
    monkeypatch.setattr(logging.getLogger("LoggingTensor"), "propagate", False)
    state = {"first": True}
    x = torch.randn(4, device=device, requires_grad=True)
    if how == "argument":
        y = hr.checkpoint(_shape_switch(state), x, debug=True)
    else:
        with torch_cp.set_checkpoint_debug_enabled(True):
            y = hr.checkpoint(_shape_switch(state), x)
    state["first"] = False
    with pytest.raises(RuntimeError, match="Operations executed during the original forward") as info:
        y.sum().backward()
    assert "aten.sin" in str(info.value)


def test_debug_is_incompatible_with_a_context_fn(device):
    if not PER_GRAPH_TASK:
        pytest.skip(f"torch {TORCH} has no checkpoint debug mode (torch >= 2.1); debug is accepted and ignored")
    x = torch.randn(3, device=device, requires_grad=True)
    pair = lambda: (torch.enable_grad(), torch.enable_grad())  # noqa: E731
    with pytest.raises(ValueError, match="debug=True is incompatible with a context_fn"):
        hr.checkpoint(torch.sin, x, debug=True, context_fn=pair)


# -- device state ---------------------------------------------------------------------------


@needs_torch2
def test_replay_runs_under_the_forwards_torch_device_context(device):
    """``with torch.device(...)`` around the forward holds for the replay, as in torch."""

    def run(impl):
        seen = []

        def fn(a):
            seen.append(torch.empty(0).device.type)  # factory call: follows the device context
            return a.sin()

        x = torch.randn(3, device=device, requires_grad=True)
        with torch.device("meta"):
            y = impl(fn, x)
        y.sum().backward()
        return seen

    assert run(hr.checkpoint) == run(native_checkpoint) == ["meta", "meta"]


# -- checkpoint_wrapper -----------------------------------------------------------------------


def test_checkpoint_wrapper_keeps_fqns_and_joins_sessions(device):
    torch.manual_seed(6)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4)).to(device)
    wrapped = hr.checkpoint_wrapper(plain)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in plain.named_parameters()]
    x = torch.randn(3, 4, device=device, requires_grad=True)
    want = torch.autograd.grad(plain(x).pow(2).sum(), [x] + list(plain.parameters()))
    with hr.recompute_handle_collector_ctx() as handles:
        loss = wrapped(x).pow(2).sum()
    assert len(handles) == 1
    hr.recompute_handle(handles[0], "w")
    with hr.recompute_session_ctx("w", retain_on_unpack=True):
        got = list(torch.autograd.grad(loss, [x], retain_graph=True))
    with hr.recompute_session_ctx("w"):
        got += torch.autograd.grad(loss, list(plain.parameters()))
    hr.clear_recompute_session("w")
    assert_bit_equal(got, want)
    assert hr.stats()["replays"] == 1


# -- torch.compile -----------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(torch, "compile"), reason=f"torch {TORCH} has no torch.compile (torch >= 2.0)")
def test_compiled_checkpoint_inside_a_collector_is_an_error_not_an_empty_list(device):
    lin = torch.nn.Linear(4, 4).to(device)

    def step(x):
        return hr.checkpoint(lambda t: lin(t).relu(), x).sum()

    compiled = torch.compile(step, backend="eager")
    x = torch.randn(2, 4, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        with pytest.raises(hr.CheckpointError, match="traced by torch.compile inside recompute_handle_collector_ctx"):
            compiled(x)
    assert handles == []
    compiled(x).backward()  # without a collector it compiles torch's checkpoint
    assert torch.allclose(x.grad, torch.autograd.grad(step(x), [x])[0])
