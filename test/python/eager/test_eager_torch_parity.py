"""Outside sessions hp_recompute.checkpoint is the installed torch's checkpoint(use_reentrant=False).

Each test runs the same program through torch's checkpoint and ours and compares what
a user sees: results, gradients, how often the function runs, which errors are raised.
Where torch 1.13 lacks a feature the test is skipped with the version that added it;
where 1.13 behaves differently on purpose the test asserts 1.13's behaviour.
"""

import logging
import re

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


@pytest.mark.parametrize("container", ["list", "tuple", "dict"])
@pytest.mark.parametrize("session", [False, True])
def test_a_tensor_inside_a_container_argument_changed_in_place_is_refused(device, container, session):
    """torch's checkpoint checks only its top-level positional tensors and replays on the
    changed value here (silently wrong dx, shown below on torch 2.x); ours refuses it,
    naming where the tensor sits, for a plain backward and for a session's prefetch."""
    lin = torch.nn.Linear(4, 4).to(device)

    def block(a, scale):
        return (lin(a).tanh() * (scale["m"] if container == "dict" else scale[0])).sum()

    def wrap(m):
        return {"list": [m], "tuple": (m,), "dict": {"m": m}}[container]

    torch.manual_seed(0)
    x = torch.randn(3, 4, device=device, requires_grad=True)
    m = torch.randn(3, 4, device=device)
    (want,) = torch.autograd.grad(block(x, wrap(m.clone())), [x])
    where = "#1['m']" if container == "dict" else "#1[0]"
    with hr.recompute_handle_collector_ctx() as handles:
        loss = hr.checkpoint(block, x, wrap(m))
    m.mul_(2)
    with pytest.raises(RuntimeError, match=re.escape(f"hp_recompute: argument {where} of checkpoint") + ".*modified in place"):
        if session:
            hr.recompute_handle(handles[0], "nested")
        torch.autograd.grad(loss, [x])
    hr.clear_recompute_session("nested")
    if PER_GRAPH_TASK:  # the reference: torch's own checkpoint gives a wrong gradient, with no error
        torch.manual_seed(0)
        x = torch.randn(3, 4, device=device, requires_grad=True)
        m = torch.randn(3, 4, device=device)
        loss = native_checkpoint(block, x, wrap(m))
        m.mul_(2)
        (got,) = torch.autograd.grad(loss, [x])
        assert not torch.allclose(got, want)


@pytest.mark.parametrize("change", ["replace", "add", "remove"])
def test_a_container_argument_whose_tensors_were_swapped_is_refused(device, change):
    """The replay reads the container, not the tensors recorded at the forward: a dict reused
    across microbatches (``kw["m"] = next_m``) would replay on the new tensor (torch's
    checkpoint gives a wrong gradient there, with no error)."""
    lin = torch.nn.Linear(4, 4).to(device)

    def block(a, kw):
        return (lin(a).tanh() * kw["m"]).sum()

    x = torch.randn(3, 4, device=device, requires_grad=True)
    kw = {"m": torch.randn(3, 4, device=device), "k": torch.randn(1, device=device)}
    loss = hr.checkpoint(block, x, kw)
    if change == "replace":
        kw["m"] = torch.randn(3, 4, device=device)
    elif change == "add":
        kw["n"] = torch.randn(1, device=device)
    else:
        del kw["k"]
    where = {"replace": "#1['m']", "add": "#1['n']", "remove": "#1['k']"}[change]
    with pytest.raises(RuntimeError, match=re.escape(f"hp_recompute: argument {where} of checkpoint") +
                       r".* is not the tensor the checkpoint received \(its list, tuple or dict was changed"):
        torch.autograd.grad(loss, [x])


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
    with pytest.raises(ValueError, match="^debug=True is incompatible with non-default context_fn$"):
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


# -- what a replay hands back for a tensor that does not require grad ---------------------------


def test_a_saved_tensor_that_needs_no_grad_keeps_its_identity_as_in_torch(device):
    """torch 2.x hands back the very object (its Python attributes included); torch 1.13 a detached copy."""

    def run(impl):
        scale = torch.randn(3, device=device)
        scale.tag = "kept"
        seen = []

        class Probe(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, c):
                ctx.save_for_backward(c)
                return a * c

            @staticmethod
            def backward(ctx, g):
                (c,) = ctx.saved_tensors
                seen.append((c is scale, getattr(c, "tag", None)))
                return g * c, None

        x = torch.randn(3, device=device, requires_grad=True)
        impl(lambda a: Probe.apply(a, scale), x).sum().backward()
        return seen

    ours, native = run(hr.checkpoint), run(native_checkpoint)
    assert ours == native
    assert ours == ([(True, "kept")] if PER_GRAPH_TASK else [(False, None)])


# -- error texts: torch's own, word for word, for the conditions torch's checkpoint detects -------


def _replay_switch(state):
    def fn(a):
        h = a.sin()
        if state["more"]:
            h = h.exp()
        return h[: state["rows"]].cos()

    return fn


@needs_torch2
@pytest.mark.parametrize("case", ["fewer", "more", "metadata", "unpacked_twice"])
def test_error_texts_are_torchs_own(device, case):
    def run(impl):
        if case == "unpacked_twice":

            class Twice(torch.autograd.Function):
                @staticmethod
                def forward(ctx, a):
                    ctx.save_for_backward(a)
                    return a * 2

                @staticmethod
                def backward(ctx, g):
                    ctx.saved_tensors
                    return g * ctx.saved_tensors[0]

            x = torch.randn(3, device=device, requires_grad=True)
            y = impl(lambda a: Twice.apply(a.sin()), x)
        else:
            state = {"more": case == "fewer", "rows": 3}
            x = torch.randn(3, device=device, requires_grad=True)
            y = impl(_replay_switch(state), x, early_stop=case != "more")
            if case == "metadata":
                state["rows"] = 2
            else:
                state["more"] = not state["more"]
        return _outcome(lambda: y.sum().backward())

    ours, native = run(hr.checkpoint), run(native_checkpoint)
    assert issubclass(native[0], torch_cp.CheckpointError), native
    assert ours == native


@needs_graph_exec_group
def test_overlapping_backwards_in_a_group_are_reported_in_torchs_words(device):
    native = _outcome(lambda: _dx_then_dw(native_checkpoint, device, group=True))
    ours = _outcome(lambda: _dx_then_dw(hr.checkpoint, device, group=True))
    assert "Performing two backward calls that overlap" in native[1]
    assert ours == native


# -- autograd.grad inside the checkpointed function, then the outer backward --------------------


def _inner_grad_variants(w):
    def weight_create_graph(a):
        b = (a @ w).sin()
        (g,) = torch.autograd.grad(b.sum(), w, create_graph=True)
        return (a @ g).pow(2).sum()

    def intermediate_retain_graph(a):
        h = a.sin()
        b = (h @ w).exp()
        (g,) = torch.autograd.grad(b.sum(), h, retain_graph=True)
        return b.sum() + (g * h).sum()

    def input_create_graph(a):
        b = (a @ w).tanh()
        (g,) = torch.autograd.grad(b.sum(), a, create_graph=True)
        return b.pow(2).sum() + (g * g).sum()

    return {f.__name__: f for f in (weight_create_graph, intermediate_retain_graph, input_create_graph)}


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("variant", ["weight_create_graph", "intermediate_retain_graph", "input_create_graph"])
def test_inner_grad_with_create_or_retain_graph_then_the_outer_backward(device, variant, early_stop):
    """The function's own backward keeps (part of) its graph; the outer backward reads the
    tensors saved after it. torch 1.13 used to refuse that ("unpacked again")."""
    torch.manual_seed(8)
    w = torch.randn(4, 4, device=device, requires_grad=True)
    fn = _inner_grad_variants(w)[variant]
    x0 = torch.randn(3, 4, device=device)
    x = x0.clone().requires_grad_()
    want = torch.autograd.grad(fn(x), [x, w])
    x = x0.clone().requires_grad_()
    got = torch.autograd.grad(hr.checkpoint(fn, x, early_stop=early_stop), [x, w])
    for g, e in zip(got, want):
        assert torch.allclose(g, e, atol=1e-6)
    if PER_GRAPH_TASK:
        x = x0.clone().requires_grad_()
        assert_bit_equal(list(got), list(torch.autograd.grad(native_checkpoint(fn, x, early_stop=early_stop), [x, w])))


# -- a forward context that swallows the forward's exception ------------------------------------


class _Swallow:
    def __init__(self, entered):
        self.entered = entered

    def __enter__(self):
        self.entered.append(True)

    def __exit__(self, *exc):
        return True  # suppresses whatever the forward raised


@needs_torch2
def test_a_forward_context_that_suppresses_the_forwards_exception_is_refused(device):
    """torch 2.x raises instead of returning None for a failed forward; under no_grad it does
    not enter the forward context at all."""

    def boom(a):
        raise ValueError("forward failed")

    def run(impl, grad):
        entered = []
        x = torch.randn(2, device=device, requires_grad=True)
        with torch.enable_grad() if grad else torch.no_grad():
            result = _outcome(lambda: impl(lambda a: a.sin(), x) if not grad else impl(
                boom, x, context_fn=lambda: (_Swallow(entered), torch.enable_grad())))
            if not grad:  # a context_fn under no_grad: the function just runs
                result = _outcome(lambda: impl(torch.sin, x, context_fn=lambda: (_Swallow(entered),
                                                                                 torch.enable_grad())))
        return result[0], result[1] if result[0] != "ok" else None, entered

    for grad in (True, False):
        native, ours = run(native_checkpoint, grad), run(hr.checkpoint, grad)
        same_kind = ours[0] == native[0] or (native[0] != "ok" != ours[0] and issubclass(ours[0], native[0]))
        assert same_kind and ours[2] == native[2], (grad, native, ours)
        if grad:
            assert issubclass(native[0], RuntimeError) and ours[1] == native[1]
