"""Four microbatches through one stage in a zero-bubble order: each block replays once per microbatch."""

import torch

import hp_recompute as hr
from hpr_eager_util import Counted, assert_bit_equal, checkpointed_chain, make_blocks, params_of

DIM, HIDDEN, BATCH, MICROBATCHES = 6, 12, 3, 4

# F = forward, P = prefetch (recompute_handle), I = dx, W = dw (+ clear). Forwards are
# interleaved with prefetches, so a prefetch that touched the caller's RNG would change the
# dropout masks of later forwards and break bit-equality with the reference.
SCHEDULE = "F0 F1 P0 F2 I0 F3 P1 I1 W0 P2 I2 W1 P3 I3 W2 W3".split()


def _microbatch_inputs(device):
    torch.manual_seed(1234)
    return [torch.randn(BATCH, DIM, device=device) for _ in range(MICROBATCHES)]


def _reference(blocks, inputs):
    """Per-microbatch (dx, dw) without checkpointing, forwards in the schedule's order."""
    torch.manual_seed(99)
    losses, xs = {}, {}
    for mb in range(MICROBATCHES):  # the schedule's forwards run in microbatch order too
        xs[mb] = inputs[mb].clone().requires_grad_()
        h = xs[mb]
        for b in blocks:
            h = b(h)
        losses[mb] = h.pow(2).sum()
    return {mb: list(torch.autograd.grad(losses[mb], [xs[mb]] + params_of(blocks))) for mb in range(MICROBATCHES)}


def test_four_microbatches_zero_bubble_each_block_replays_once(device):
    blocks = make_blocks(2, DIM, HIDDEN, device, p=0.3, seed=5)
    params = params_of(blocks)
    inputs = _microbatch_inputs(device)
    want = _reference(blocks, inputs)
    counted = {mb: [Counted(b) for b in blocks] for mb in range(MICROBATCHES)}
    xs, losses, handles, got = {}, {}, {}, {}
    torch.manual_seed(99)
    for action in SCHEDULE:
        kind, mb = action[0], int(action[1:])
        sid = f"s0.mb{mb}"
        if kind == "F":
            xs[mb], losses[mb], handles[mb] = checkpointed_chain(counted[mb], inputs[mb])
        elif kind == "P":
            for handle in handles[mb]:
                hr.recompute_handle(handle, sid)
        elif kind == "I":
            with hr.recompute_session_ctx(sid, retain_on_unpack=True):
                got[mb] = list(torch.autograd.grad(losses[mb], [xs[mb]], retain_graph=True))
        else:
            with hr.recompute_session_ctx(sid):
                got[mb] += list(torch.autograd.grad(losses[mb], params))
            hr.clear_recompute_session(sid)
            del losses[mb]
    for mb in range(MICROBATCHES):
        assert [c.calls for c in counted[mb]] == [2, 2], mb  # forward + exactly one replay
        assert_bit_equal(got[mb], want[mb])
    assert hr.stats()["session_replays"] == 2 * MICROBATCHES
    assert hr.stats()["plain_replays"] == 0
    assert hr.live_sessions() == []
