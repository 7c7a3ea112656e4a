"""Lifetime of recomputed tensors: alive only while a session retains them, gone after clear."""

import gc
import weakref

import pytest
import torch

import hp_recompute as hr
from hpr_eager_util import count_saved, live_tensors, make_blocks, params_of

DIM = 5
HIDDEN = 17  # only the blocks' intermediates have this width
BATCHES = (3, 7)  # one microbatch per batch size, so shapes tell the microbatches apart


def _hidden_of(batch):
    return lambda t: tuple(t.shape) == (batch, HIDDEN)


@pytest.fixture
def setup(device):
    blocks = make_blocks(2, DIM, HIDDEN, device, p=0.25)
    params = params_of(blocks)
    # How many hidden-width tensors autograd saves for one microbatch, counted without hp_recompute.
    expected = {}
    for batch in BATCHES:
        x = torch.randn(batch, DIM, device=device, requires_grad=True)
        counts = count_saved(lambda t: blocks[1](blocks[0](t)), x)
        expected[batch] = counts[str((batch, HIDDEN))]
    assert all(n > 0 for n in expected.values())
    return blocks, params, expected


def _forward(blocks, batch, device):
    x = torch.randn(batch, DIM, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = hr.checkpoint(blocks[1], hr.checkpoint(blocks[0], x)).pow(2).sum()
    return x, loss, handles


def test_only_the_retained_session_is_alive_between_dx_and_dw(device, setup):
    blocks, params, expected = setup
    small, large = BATCHES
    x0, loss0, h0 = _forward(blocks, small, device)
    x1, loss1, h1 = _forward(blocks, large, device)
    assert live_tensors(_hidden_of(small)) == 0  # checkpointed forward keeps no intermediates
    for h in h0:
        hr.recompute_handle(h, "mb0")
    with hr.recompute_session_ctx("mb0", retain_on_unpack=True):
        torch.autograd.grad(loss0, [x0], retain_graph=True)
    # dx -> dw window of mb0: its replayed tensors are alive, mb1 has none yet.
    assert live_tensors(_hidden_of(small)) == expected[small]
    assert live_tensors(_hidden_of(large)) == 0
    assert hr.session_stats("mb0")["retained_tensors"] >= expected[small]
    with hr.recompute_session_ctx("mb0"):
        torch.autograd.grad(loss0, params)
    hr.clear_recompute_session("mb0")
    assert live_tensors(_hidden_of(small)) == 0
    for h in h1:
        hr.recompute_handle(h, "mb1")
    with hr.recompute_session_ctx("mb1", retain_on_unpack=True):
        torch.autograd.grad(loss1, [x1], retain_graph=True)
    assert live_tensors(_hidden_of(large)) == expected[large]
    assert live_tensors(_hidden_of(small)) == 0
    with hr.recompute_session_ctx("mb1"):
        torch.autograd.grad(loss1, params)
    hr.clear_recompute_session("mb1")
    assert live_tensors(_hidden_of(large)) == 0


def test_clear_frees_an_abandoned_session_while_the_graph_lives(device, setup):
    blocks, params, expected = setup
    batch = BATCHES[0]
    x, loss, handles = _forward(blocks, batch, device)
    for h in handles:
        hr.recompute_handle(h, "abandoned")
    assert live_tensors(_hidden_of(batch)) == expected[batch]
    hr.clear_recompute_session("abandoned")  # no backward ever ran
    assert live_tensors(_hidden_of(batch)) == 0
    assert hr.session_stats("abandoned") is None
    # The frames serve a plain backward afterwards.
    grads = torch.autograd.grad(loss, [x] + params)
    assert all(torch.isfinite(g).all() for g in grads)


def test_clear_after_partial_use_frees_everything(device, setup):
    blocks, params, expected = setup
    batch = BATCHES[1]
    x, loss, handles = _forward(blocks, batch, device)
    with hr.recompute_session_ctx("partial", retain_on_unpack=True):
        torch.autograd.grad(loss, [x], retain_graph=True)  # dx only, dw never comes
    assert live_tensors(_hidden_of(batch)) == expected[batch]
    hr.clear_recompute_session("partial")
    assert live_tensors(_hidden_of(batch)) == 0
    del loss, handles


def test_failed_prefetch_keeps_nothing(device, setup):
    blocks, params, expected = setup
    batch = BATCHES[0]
    x = torch.randn(batch, DIM, device=device, requires_grad=True)
    state = {"fail": False}

    def fn(t):
        h = blocks[0].fc1(t)  # a hidden-width tensor is saved before the failure
        if state["fail"]:
            raise RuntimeError("replay failed")
        return blocks[0].fc2(torch.relu(h))

    with hr.recompute_handle_collector_ctx() as handles:
        loss = hr.checkpoint(fn, x).sum()
    state["fail"] = True
    with pytest.raises(RuntimeError, match="replay failed"):
        hr.recompute_handle(handles[0], "failing")
    assert live_tensors(_hidden_of(batch)) == 0
    assert hr.live_sessions() == []
    del loss


def test_plain_backward_keeps_nothing_after_the_graph_is_freed(device, setup):
    blocks, params, expected = setup
    batch = BATCHES[0]
    x, loss, handles = _forward(blocks, batch, device)
    torch.autograd.grad(loss, [x] + params)
    del loss
    assert live_tensors(_hidden_of(batch)) == 0
    assert [h.frame() for h in handles] == [None, None]  # frames die with their graph


def test_failed_checks_in_prefetches_keep_no_replay_alive(device):
    """A count or metadata mismatch found by a prefetch must not pin the replay's tensors.

    The replay's activations reach its pack hook through autograd's C++ saved-variable
    hooks; if the raised error stayed reachable from that hook, the cycle would run
    through C++, where gc cannot see it. Weak references tell whether anything survives.
    """
    replayed = []

    def failed_prefetch(kind, sid):
        weight = torch.ones(HIDDEN, DIM, device=device)
        state = {"dtype": torch.float32, "extra": False}

        def fn(x):
            h = torch.nn.functional.linear(x, weight).sin()
            replayed.append(weakref.ref(h))
            h = h.to(state["dtype"]).exp()
            if state["extra"]:
                h = h.cos()
            return h.sum(-1)

        x = torch.randn(3, DIM, device=device, requires_grad=True)
        with hr.recompute_handle_collector_ctx() as handles:
            y = hr.checkpoint(fn, x, early_stop=False)
        if kind == "metadata":
            state["dtype"], message = torch.float64, "tensors have different metadata"
        else:
            state["extra"], message = True, "trying to save more tensors during recomputation"
        with pytest.raises(hr.CheckpointError, match=message):
            hr.recompute_handle(handles[0], sid)
        del y

    for i, kind in enumerate(["metadata", "count", "metadata"]):
        failed_prefetch(kind, f"leak{i}")
    gc.collect()
    assert len(replayed) == 6  # three forwards, three failed replays
    assert [r() is None for r in replayed] == [True] * 6
    assert hr.live_sessions() == []
