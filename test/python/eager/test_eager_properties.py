"""Property tests of the eager session API (hypothesis): random programs over several sessions.

A program has up to four microbatches, each a chain of two checkpointed blocks (with
dropout). Per microbatch hypothesis draws what happens after its forward -- a prefetch or
not, then dx then dw, or one full backward, or nothing (abandoned), an exception inside
a session context, a consumer on another thread -- and then how the microbatches
interleave. Whatever the program:

* every gradient equals the plain (no checkpoint) run of the same microbatch, bit for bit;
* each block replays exactly once for a microbatch that was prefetched or consumed, and
  never for one abandoned without a prefetch (hpr.session.one-binding, hpr.session.retain);
* after the clears no session is alive, and once the graphs are dropped no checkpoint
  frame survives (the handles' weak references are dead);
* nothing waits forever: each consumer thread is joined with a timeout.
"""

from __future__ import annotations

import gc
import threading
from typing import Dict, List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hp_recompute as hr
from hpr_eager_util import Counted, assert_bit_equal, checkpointed_chain, make_blocks, params_of

DIM, HIDDEN = 6, 10
FATES = ("split", "full", "abandon")


@st.composite
def programs(draw) -> Tuple[List[Tuple[str, int]], Dict[int, Dict[str, bool]]]:
    n = draw(st.integers(1, 4))
    plans = {mb: {"fate": draw(st.sampled_from(FATES)), "prefetch": draw(st.booleans()),
                  "raise": draw(st.booleans()), "thread": draw(st.booleans())} for mb in range(n)}
    per_mb: Dict[int, List[str]] = {}
    for mb, p in plans.items():
        ops = ["F"]
        if p["prefetch"]:
            ops.append("P")
        if p["raise"]:
            ops.append("E")
        ops += {"split": ["I", "W"], "full": ["B"], "abandon": []}[p["fate"]]
        per_mb[mb] = ops + ["C"]
    # Interleave: at each step take the next op of a microbatch chosen by hypothesis.
    order: List[Tuple[str, int]] = []
    left = {mb: list(ops) for mb, ops in per_mb.items()}
    while left:
        mb = draw(st.sampled_from(sorted(left)))
        order.append((left[mb].pop(0), mb))
        if not left[mb]:
            del left[mb]
    return order, plans


def _reference(blocks, x: torch.Tensor, seed: int) -> List[torch.Tensor]:
    torch.manual_seed(seed)
    xr = x.clone().requires_grad_()
    h = xr
    for b in blocks:
        h = b(h)
    loss = h.pow(2).sum()
    return list(torch.autograd.grad(loss, [xr] + params_of(blocks)))


def _on_thread(fn) -> None:
    """Runs ``fn`` on another thread; a wait longer than 30 s is a deadlock."""
    errors: List[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "a consumer thread did not finish within 30 s (deadlock)"
    if errors:
        raise errors[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_keep_the_session_rules(program) -> None:
    order, plans = program
    hr.reset_stats()
    blocks = make_blocks(2, DIM, HIDDEN, "cpu", p=0.3, seed=3)
    params = params_of(blocks)
    inputs = {mb: torch.randn(3, DIM, generator=torch.Generator().manual_seed(mb)) for mb in plans}
    counted = {mb: [Counted(b) for b in blocks] for mb in plans}
    xs, losses, handles, got = {}, {}, {}, {mb: [] for mb in plans}
    for op, mb in order:
        sid = f"s0.mb{mb}"
        consume = None
        if op == "F":
            torch.manual_seed(100 + mb)  # the reference draws the same dropout masks
            xs[mb], losses[mb], handles[mb] = checkpointed_chain(counted[mb], inputs[mb])
        elif op == "P":
            for handle in handles[mb]:
                hr.recompute_handle(handle, sid)
        elif op == "E":  # an exception inside a session context leaves the session usable
            with pytest.raises(RuntimeError, match="planted"):
                with hr.recompute_session_ctx(sid, retain_on_unpack=True):
                    raise RuntimeError("planted")
        elif op == "I":
            def consume():
                with hr.recompute_session_ctx(sid, retain_on_unpack=True):
                    got[mb] += torch.autograd.grad(losses[mb], [xs[mb]], retain_graph=True)
        elif op == "W":
            def consume():
                with hr.recompute_session_ctx(sid):
                    got[mb] += torch.autograd.grad(losses[mb], params)
        elif op == "B":
            def consume():
                with hr.recompute_session_ctx(sid):
                    got[mb] += torch.autograd.grad(losses[mb], [xs[mb]] + params)
        elif op == "C":
            hr.clear_recompute_session(sid)
            hr.clear_recompute_session(sid)  # idempotent
        if consume is not None:
            _on_thread(consume) if plans[mb]["thread"] else consume()

    for mb, p in plans.items():
        replayed = p["prefetch"] or p["fate"] != "abandon"
        assert [c.calls for c in counted[mb]] == [2 if replayed else 1] * 2, (mb, p)
        if p["fate"] != "abandon":
            assert_bit_equal(got[mb], _reference(blocks, inputs[mb], 100 + mb))
    assert hr.stats()["plain_replays"] == 0
    assert hr.live_sessions() == []
    losses.clear()
    gc.collect()
    assert all(h.frame() is None for hs in handles.values() for h in hs), "a checkpoint frame outlived its graph"
