"""dx/dw split (NOTE [ dx/dw split ] in backward_split.py): exact gradients, no extra work.

The work is counted by torch's own ``FlopCounterMode`` (matmuls, the bulk of a backward),
the gradients are compared with one plain ``autograd.grad`` over inputs and weights.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import hp_recompute as hpr
from hp_recompute.backward_split import SPLIT_SUPPORTED, backward_input, backward_weight

REPO = Path(__file__).resolve().parents[3]
needs_split = pytest.mark.skipif(not SPLIT_SUPPORTED, reason="torch < 2.2: W re-walks the input path (Rule 5)")


def _gpt_blocks(n: int) -> nn.Module:
    spec = importlib.util.spec_from_file_location("hpr_gpt_example", REPO / "examples" / "gpt" / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("hpr_gpt_example", module)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return nn.Sequential(*[module.Block(module.DIM, module.HEADS, module.SEQ) for _ in range(n)])


def _flops(fn):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as mode:
        result = fn()
    return mode.get_total_flops(), result


def _stage(name: str):
    """(module, input requiring grad or int tokens, output gradient or None)."""
    torch.manual_seed(1)
    if name == "linear-chain":
        net = nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])
        return net, torch.randn(16, 32, requires_grad=True), torch.randn(16, 32)
    if name == "gpt-blocks":
        return _gpt_blocks(2), torch.randn(2, 40, 48, requires_grad=True), torch.randn(2, 40, 48)
    if name == "embedding-stage":  # stage 0: integer input, no input path at all
        net = nn.Sequential(nn.Embedding(64, 48), nn.Linear(48, 48))
        return net, torch.randint(0, 64, (4, 40)), torch.randn(4, 40, 48)
    if name == "loss-stage":  # last stage: a scalar loss, no output gradient
        net = nn.Sequential(nn.LayerNorm(48), nn.Linear(48, 64))
        return nn.Sequential(net, _Mean()), torch.randn(4, 40, 48, requires_grad=True), None
    raise AssertionError(name)


class _Mean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.square().mean()


STAGES = ["linear-chain", "gpt-blocks", "embedding-stage", "loss-stage"]


def _inputs(x: torch.Tensor):
    return [x] if x.requires_grad else []


@pytest.mark.parametrize("name", STAGES)
def test_split_gradients_equal_one_backward(name: str) -> None:
    net, x, g = _stage(name)
    weights = list(net.parameters())
    grads_out = None if g is None else [g]
    want = torch.autograd.grad([net(x)], _inputs(x) + weights, grads_out)
    dx, state = backward_input([net(x)], grads_out, _inputs(x), weights)
    dw = backward_weight(state)
    got = list(dx) + list(dw)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@needs_split
@pytest.mark.parametrize("name", STAGES)
def test_split_does_the_work_of_one_backward(name: str) -> None:
    net, x, g = _stage(name)
    weights = list(net.parameters())
    grads_out = None if g is None else [g]
    out = net(x)
    full, _ = _flops(lambda: torch.autograd.grad([out], _inputs(x) + weights, grads_out))
    out = net(x)
    i_flops, (_, state) = _flops(lambda: backward_input([out], grads_out, _inputs(x), weights))
    w_flops, _ = _flops(lambda: backward_weight(state))
    assert full > 0 and w_flops > 0
    assert i_flops + w_flops <= 1.02 * full, (i_flops, w_flops, full)
    # The naive W (autograd.grad(out, weights)) re-walks the input path: the split must beat it
    # wherever there is an input path to re-walk below a weight.
    if x.requires_grad:
        out = net(x)
        naive, _ = _flops(lambda: torch.autograd.grad([out], weights, grads_out))
        assert w_flops < naive


@needs_split
def test_tied_weight_falls_back_to_a_rewalk_and_stays_exact() -> None:
    torch.manual_seed(2)
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    want = torch.autograd.grad([lin(torch.tanh(lin(x))).sum()], [x, *lin.parameters()])
    (dx,), state = backward_input([lin(torch.tanh(lin(x))).sum()], None, [x], list(lin.parameters()))
    assert any(not group.seeds for group in state.groups)  # Rule 4
    dw = backward_weight(state)
    for a, b in zip((dx, *dw), want):
        torch.testing.assert_close(a, b)


def test_split_inside_a_session_replays_once() -> None:
    net = _gpt_blocks(2)
    x = torch.randn(2, 40, 48, requires_grad=True)
    g = torch.randn(2, 40, 48)
    weights = list(net.parameters())
    want = torch.autograd.grad([net(x)], [x] + weights, [g])
    hpr.reset_stats()
    with hpr.recompute_handle_collector_ctx() as handles:
        out = hpr.checkpoint(net, x)
    assert len(handles) == 1
    with hpr.recompute_session_ctx("s", retain_on_unpack=True):
        (dx,), state = backward_input([out], [g], [x], weights)
    with hpr.recompute_session_ctx("s", retain_on_unpack=False):
        dw = backward_weight(state)
    hpr.clear_recompute_session("s")
    assert hpr.stats()["replays"] == 1
    for a, b in zip((dx, *dw), want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not hasattr(torch.utils.checkpoint, "GraphExecGroup"),
                    reason="torch.utils.checkpoint.GraphExecGroup is torch >= 2.9")
def test_torch_graph_exec_group_cannot_share_one_replay_between_dx_and_dw() -> None:
    """Why the split needs sessions: torch's own one-replay-per-group context refuses
    I and W of one checkpointed block (they read the same saved activations)."""
    import torch.utils.checkpoint as torch_checkpoint

    net = _gpt_blocks(1)
    x = torch.randn(2, 40, 48, requires_grad=True)
    out = torch_checkpoint.checkpoint(net, x, use_reentrant=False)
    group = torch_checkpoint.GraphExecGroup()
    with pytest.raises(torch_checkpoint.CheckpointError, match="two backward calls that overlap"):
        with group:
            _, state = backward_input([out], [torch.ones_like(out)], [x], list(net.parameters()),
                                      retain_graph=True)
        with group:
            backward_weight(state)


def test_weight_state_is_released_after_w() -> None:
    net, x, g = _stage("linear-chain")
    _, state = backward_input([net(x)], [g], [x], list(net.parameters()))
    backward_weight(state)
    assert not state.groups and not state.recorded and not state.outputs
