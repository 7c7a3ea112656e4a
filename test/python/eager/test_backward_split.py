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
needs_split = pytest.mark.skipif(not SPLIT_SUPPORTED,
                                 reason="torch < 2.2: W re-walks the input path (hpr.split.rewalk-old-torch)")


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
    assert any(not group.seeds for group in state.groups)  # hpr.split.rewalk-shared-seeds
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


def _held_bytes(handles, own) -> int:
    """Distinct storage bytes the sessions' holders hold, but those of ``own`` tensors."""
    skip = {t.untyped_storage().data_ptr() for t in own}
    held = {}
    for handle in handles:
        for t in handle.frame().retained():
            storage = t.untyped_storage()
            if storage.data_ptr() not in skip:
                held[storage.data_ptr()] = storage.nbytes()
    return sum(held.values())


@needs_split
@pytest.mark.parametrize("prefetched", [True, False], ids=["prefetched", "replayed-by-dx"])
def test_dx_releases_what_no_dw_node_reads_and_dw_stays_exact(prefetched: bool) -> None:
    """hpr.split.release-unread: after I the session holds only what the seeds (and the nodes below them) read."""
    net = _gpt_blocks(2)
    x = torch.randn(2, 40, 48, requires_grad=True)
    g = torch.randn(2, 40, 48)
    weights = list(net.parameters())
    want = torch.autograd.grad([net(x)], [x] + weights, [g])
    with hpr.recompute_handle_collector_ctx() as handles:
        out = hpr.checkpoint(net[0], x)
        out = hpr.checkpoint(net[1], out)
    if prefetched:
        for handle in handles:
            hpr.recompute_handle(handle, "s")
    with hpr.recompute_session_ctx("s", retain_on_unpack=True):
        (dx,), state = backward_input([out], [g], [x], weights)
        after_dx = _held_bytes(handles, weights + [x])
    # What I left is what W reads: dropping it instead (as a POP consumer would) leaves W
    # nothing, so the release kept neither too little (W exact below) nor everything.
    replayed = sum(t.numel() * t.element_size() for t in _replay_of(net, x))
    assert 0 < after_dx < 0.75 * replayed
    with hpr.recompute_session_ctx("s", retain_on_unpack=False):
        dw = backward_weight(state)
    hpr.clear_recompute_session("s")
    for a, b in zip((dx, *dw), want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _replay_of(net: nn.Module, x: torch.Tensor):
    """The tensors the blocks' forward saves for backward, but parameters and ``x``."""
    saved = []
    own = {p.untyped_storage().data_ptr() for p in net.parameters()} | {x.untyped_storage().data_ptr()}

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(x)
    return list({t.untyped_storage().data_ptr(): t for t in saved}.values())


@needs_split
@pytest.mark.parametrize("explicit", [True, False], ids=["replay_for_weight", "replayed-by-dw"])
def test_a_session_dropped_after_dx_replays_what_dw_reads_and_stays_exact(explicit: bool) -> None:
    """hpr.session.replay-for-weight: after its dx the session holds nothing; the replay for the dw
    brings back what the dx kept (hpr.split.release-unread), no more, and the gradients stay exact."""
    net = _gpt_blocks(2)
    x = torch.randn(2, 40, 48, requires_grad=True)
    g = torch.randn(2, 40, 48)
    weights = list(net.parameters())
    want = torch.autograd.grad([net(x)], [x] + weights, [g])
    scope = hpr.SessionScope("weight replay")
    with hpr.recompute_handle_collector_ctx() as handles:
        out = hpr.checkpoint(net[0], x)
        out = hpr.checkpoint(net[1], out)
    for handle in handles:
        scope.recompute_handle(handle, "s")
    with scope.recompute_session_ctx("s", retain_on_unpack=True):
        (dx,), state = backward_input([out], [g], [x], weights)
    kept_by_dx = _held_bytes(handles, weights + [x])
    scope.drop_replay("s")
    assert _held_bytes(handles, weights + [x]) == 0
    if explicit:
        scope.replay_for_weight("s")
        assert _held_bytes(handles, weights + [x]) == kept_by_dx > 0
    with scope.recompute_session_ctx("s", retain_on_unpack=False):
        dw = backward_weight(state)
    assert scope.stats()["replays"] == 2 * len(handles)
    scope.clear_recompute_session("s")
    for a, b in zip((dx, *dw), want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@needs_split
def test_a_session_drops_its_replay_for_the_dw_once_and_only_between_backwards() -> None:
    """hpr.session.replay-for-weight: the refusals name the rule."""
    net = _gpt_blocks(1)
    x = torch.randn(2, 40, 48, requires_grad=True)
    scope = hpr.SessionScope("weight replay refusals")
    with hpr.recompute_handle_collector_ctx() as handles:
        out = hpr.checkpoint(net, x)
    rule = r"\[hpr\.session\.replay-for-weight\]$"
    with pytest.raises(hpr.CheckpointError, match=r"no live session has this id " + rule):
        scope.drop_replay("s")
    scope.recompute_handle(handles[0], "s")
    with pytest.raises(hpr.CheckpointError, match=r"was not dropped after the dx; .*" + rule):
        scope.replay_for_weight("s")
    try:
        with scope.recompute_session_ctx("s", retain_on_unpack=True):
            backward_input([out.sum()], None, [x], list(net.parameters()))
            with pytest.raises(hpr.CheckpointError, match=r"inside that session's own recompute_session_ctx; .*" + rule):
                scope.drop_replay("s")
        scope.drop_replay("s")
        scope.replay_for_weight("s")
        with pytest.raises(hpr.CheckpointError, match=r"dropped its replay of checkpoint .* once already; .*" + rule):
            scope.drop_replay("s")
    finally:
        scope.clear_recompute_session("s")


@needs_split
def test_a_selective_checkpoint_refuses_to_drop_its_replay_for_the_dw() -> None:
    """hpr.session.replay-for-weight: a selective policy's replay reads what the forward saved, once."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    scope = hpr.SessionScope("weight replay selective")
    with hpr.recompute_handle_collector_ctx() as handles:
        out = hpr.checkpoint(lambda t: torch.tanh(lin(t)), x,
                             context_fn=lambda: create_selective_checkpoint_contexts(policy))
    scope.recompute_handle(handles[0], "s")
    try:
        with scope.recompute_session_ctx("s", retain_on_unpack=True):
            backward_input([out.sum()], None, [x], list(lin.parameters()))
        with pytest.raises(hpr.CheckpointError, match=r"has a selective policy .* "
                                                      r"\[hpr\.session\.replay-for-weight\]$"):
            scope.drop_replay("s")
    finally:
        scope.clear_recompute_session("s")


@needs_split
def test_a_released_tensor_read_again_raises_naming_the_rule() -> None:
    """hpr.split.release-unread: a second dx-like backward after I finds what I released gone, and says so."""
    net = _gpt_blocks(1)
    x = torch.randn(2, 40, 48, requires_grad=True)
    with hpr.recompute_handle_collector_ctx():
        out = hpr.checkpoint(net, x)
    try:
        with hpr.recompute_session_ctx("s", retain_on_unpack=True):
            backward_input([out.sum()], None, [x], list(net.parameters()))
            with pytest.raises(hpr.CheckpointError, match=r"released after dx .* \[hpr\.split\.release-unread\]$"):
                torch.autograd.grad([out.sum()], [x])
    finally:
        hpr.clear_recompute_session("s")


@needs_split
def test_a_rewalking_w_releases_nothing() -> None:
    """hpr.split.release-unread needs seeds: a group that re-walks from the outputs
    (hpr.split.rewalk-shared-seeds) reads everything."""
    torch.manual_seed(2)
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    want = torch.autograd.grad([lin(torch.tanh(lin(x))).sum()], [x, *lin.parameters()])
    with hpr.recompute_handle_collector_ctx() as handles:
        out = hpr.checkpoint(lambda t: lin(torch.tanh(lin(t))), x)
    with hpr.recompute_session_ctx("s", retain_on_unpack=True):
        (dx,), state = backward_input([out.sum()], None, [x], list(lin.parameters()))
    assert any(not group.seeds for group in state.groups)  # hpr.split.rewalk-shared-seeds
    assert not any(h.released for h in (r() for r in handles[0].frame().holders) if h is not None)
    with hpr.recompute_session_ctx("s"):
        dw = backward_weight(state)
    hpr.clear_recompute_session("s")
    for a, b in zip((dx, *dw), want):
        torch.testing.assert_close(a, b)


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


# -- never a silent None (hpr.split.no-silent-none) -----------------------------------------


@pytest.mark.parametrize("with_input", [True, False])
def test_a_weight_w_cannot_reach_raises_naming_it(with_input: bool) -> None:
    torch.manual_seed(0)
    used, unused = nn.Linear(3, 3), nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    out = used(x).tanh().sum()
    named = list(used.named_parameters(prefix="used")) + list(unused.named_parameters(prefix="unused"))
    _, state = backward_input([out], None, [x] if with_input else [], [p for _, p in named],
                              names=[n for n, _ in named])
    with pytest.raises(hpr.CheckpointError, match=r"^hp_recompute: backward_weight: weights 'unused\.weight', "
                       r"'unused\.bias' are not reached by the graph of the outputs, .*reshard_after_forward=True"):
        backward_weight(state)


def test_a_second_w_of_one_state_says_so() -> None:
    """W releases its state; a second W of it is refused as such, not as weights the graph
    does not reach (which sent users looking for FSDP)."""
    w = torch.randn(3, requires_grad=True)
    _, state = backward_input([(w * 2).sum()], None, [], [w])
    backward_weight(state)
    with pytest.raises(hpr.CheckpointError) as error:
        backward_weight(state)
    assert str(error.value) == ("hp_recompute: backward_weight: this state's W already ran (W runs once per "
                                "backward_input, and its state is released then); call backward_input again for "
                                "another W")


def test_a_frozen_weight_is_refused_naming_it() -> None:
    """A weight that does not require grad has no gradient edge: named, not torch's raw
    'not possible to get the gradient edge'."""
    layer = nn.Linear(3, 3)
    layer.bias.requires_grad_(False)
    x = torch.randn(2, 3, requires_grad=True)
    named = list(layer.named_parameters())
    with pytest.raises(ValueError) as error:
        backward_input([layer(x).sum()], None, [x], [p for _, p in named], names=[n for n, _ in named])
    assert str(error.value) == ("hp_recompute: backward_input: weight 'bias' does not require grad (frozen), so W "
                                "has no gradient to give it; leave frozen weights out of the weights (a module as "
                                "the weights leaves them out by itself)")
    _, state = backward_input([layer(x).sum()], None, [x], layer)  # the module: its trainable weights
    assert backward_weight(state)[0].shape == (3, 3)


def test_weight_names_must_be_one_str_per_weight() -> None:
    w = torch.randn(2, requires_grad=True)
    with pytest.raises(ValueError, match=r"^hp_recompute: backward_input: names must be one str per weight \(1\)"):
        backward_input([(w * 2).sum()], None, [], [w], names=["a", "b"])


_FSDP_CHILD = r"""
import os, sys
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
import hp_recompute as hpr
from hp_recompute.backward_split import backward_input, backward_weight

dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[2])
reshard = sys.argv[1] == "reshard"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
x0 = torch.randn(2, 4)
want = torch.autograd.grad(model(x0).sum(), list(model.parameters()))
for layer in model:
    fully_shard(layer, reshard_after_forward=reshard)
fully_shard(model, reshard_after_forward=reshard)
x = x0.clone().requires_grad_()
out = model(x)
named = list(model.named_parameters())
_, state = backward_input([out], [torch.ones_like(out)], [x], [p for _, p in named], names=[n for n, _ in named])
try:
    got = backward_weight(state)
except hpr.CheckpointError as e:
    print("ERROR", e)
else:
    full = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in got]
    print("EQUAL", all(torch.allclose(a, b) for a, b in zip(full, want)))
dist.destroy_process_group()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_fsdp2() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # noqa: BLE001 -- ImportError; torch 1.13 under Python 3.11 raises ValueError
        return False
    return torch.distributed.is_gloo_available()


@pytest.mark.skipif(not _has_fsdp2(),
                    reason=f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6)")
@pytest.mark.parametrize("reshard", ["reshard", "keep"])
def test_fsdp2_reshard_after_forward_weights_raise_instead_of_none(reshard: str) -> None:
    """FSDP2 on CPU + gloo, one process: with reshard_after_forward=True the parameters W is
    asked for are sharded DTensors outside the graph; W must say so (hpr.split.no-silent-none), not return None."""
    import os
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _FSDP_CHILD, reshard, str(_free_port())], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if reshard == "reshard":
        assert proc.stdout.startswith("ERROR hp_recompute: backward_weight: weights '0.weight', '0.bias', "
                                      "'1.weight', '1.bias' are not reached by the graph"), proc.stdout
        assert "fully_shard-ed with reshard_after_forward=True" in proc.stdout
    else:
        assert proc.stdout.strip() == "EQUAL True", proc.stdout


def test_a_module_as_the_weights_names_them_and_keeps_their_order() -> None:
    """hpr.split.module-weights without FSDP: the module's parameters that require grad, named by
    named_parameters()."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))
    model[2].bias.requires_grad_(False)
    x = torch.randn(4, 3, requires_grad=True)
    out = model(x).sum()
    want = torch.autograd.grad(out, [x] + [p for p in model.parameters() if p.requires_grad], retain_graph=True)
    (dx,), state = backward_input([out], None, [x], model)
    assert state.names == ["'0.weight'", "'0.bias'", "'2.weight'"]
    got = backward_weight(state)
    torch.testing.assert_close(dx, want[0])
    for g, w in zip(got, want[1:]):
        torch.testing.assert_close(g, w)
    with pytest.raises(ValueError, match=r"^hp_recompute: backward_input: names are the module's own"):
        backward_input([model(x).sum()], None, [x], model, names=["a"])
