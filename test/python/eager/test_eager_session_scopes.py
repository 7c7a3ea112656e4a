"""Session scopes (hpr.session.scoped-ids): each owner its own namespace of session ids; O(1) context entry."""

import pytest
import torch

import hp_recompute as hr
from hpr_eager_util import Counted, assert_bit_equal, make_blocks, params_of


def _model(device, seed):
    blocks = make_blocks(2, 5, 7, device, seed=seed)
    return blocks, [Counted(b) for b in blocks]


def _forward(counted, x):
    with hr.recompute_handle_collector_ctx() as handles:
        h = x
        for fn in counted:
            h = hr.checkpoint(fn, h)
        loss = h.pow(2).sum()
    return loss, handles


def _reference(blocks, x):
    x = x.detach().clone().requires_grad_()
    h = x
    for b in blocks:
        h = b(h)
    return list(torch.autograd.grad(h.pow(2).sum(), [x] + params_of(blocks)))


def test_two_scopes_keep_sessions_of_the_same_id_apart(device):
    """Two schedules in one process both use "s3.mb0": their sessions never mix."""
    scopes = [hr.SessionScope("A"), hr.SessionScope("B")]
    models = [_model(device, seed) for seed in (1, 2)]
    xs = [torch.randn(3, 5, device=device, requires_grad=True) for _ in models]
    runs = [_forward(counted, x) for (_, counted), x in zip(models, xs)]
    for scope, (_, handles) in zip(scopes, runs):
        for h in handles:
            scope.recompute_handle(h, "s3.mb0")
    assert [scope.live_sessions() for scope in scopes] == [["s3.mb0"], ["s3.mb0"]]
    assert hr.live_sessions() == []  # the default scope has none
    assert hr.stats()["live_sessions"] == 2
    got = []
    for scope, (blocks, _), x, (loss, _) in zip(scopes, models, xs, runs):
        with scope.recompute_session_ctx("s3.mb0", retain_on_unpack=True):
            dx = list(torch.autograd.grad(loss, [x], retain_graph=True))
        with scope.recompute_session_ctx("s3.mb0"):
            dw = list(torch.autograd.grad(loss, params_of(blocks)))
        got.append(dx + dw)
    scopes[0].clear_recompute_session("s3.mb0")
    assert scopes[0].live_sessions() == [] and scopes[1].live_sessions() == ["s3.mb0"]
    assert scopes[1].session_stats("s3.mb0")["replays"] == 2
    assert scopes[1].clear_all() == ["s3.mb0"] and scopes[1].live_sessions() == []
    for (blocks, counted), x, g in zip(models, xs, got):
        assert [c.calls for c in counted] == [2, 2]  # forward + one prefetch each, nothing replayed twice
        assert_bit_equal(g, _reference(blocks, x))
    for scope in scopes:
        assert scope.stats() == {"replays": 2, "session_replays": 2, "prefetches": 2, "clears": 1,
                                 "live_sessions": 0}
    assert hr.stats()["session_replays"] == 4  # process-wide: all scopes
    scopes[0].reset_stats()
    assert scopes[0].stats()["replays"] == 0 and scopes[1].stats()["replays"] == 2


def test_a_checkpoint_bound_in_one_scope_cannot_join_the_same_id_of_another(device):
    a, b = hr.SessionScope("schedule A"), hr.SessionScope("schedule B")
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(torch.sin, x).sum()
    a.recompute_handle(handles[0], "s0.mb0")
    with pytest.raises(hr.CheckpointError, match=r"^hp_recompute: checkpoint '.*sin' is bound to session 's0\.mb0' of "
                       r"scope 'schedule A' and cannot join session 's0\.mb0' of scope 'schedule B'"):
        b.recompute_handle(handles[0], "s0.mb0")
    a.clear_recompute_session("s0.mb0")
    b.recompute_handle(handles[0], "s0.mb0")
    with b.recompute_session_ctx("s0.mb0"):
        y.backward()
    b.clear_recompute_session("s0.mb0")
    assert torch.allclose(x.grad, torch.cos(x))


def test_session_contexts_of_different_scopes_do_not_nest_on_one_thread():
    a = hr.SessionScope("A")
    with a.recompute_session_ctx("s"):
        with pytest.raises(hr.CheckpointError, match=r"recompute_session_ctx\('s'\) entered while "
                           r"recompute_session_ctx\('s' of scope 'A'\) is open on this thread"):
            with hr.recompute_session_ctx("s"):
                pass
    a.clear_all()


def test_scope_name_must_be_a_string():
    with pytest.raises(ValueError, match="^hp_recompute: SessionScope: name must be a str or None, got int$"):
        hr.SessionScope(3)


@pytest.mark.parametrize("bad", [float("nan"), torch.tensor([1.0, 2.0])])
def test_a_session_id_that_is_not_equal_to_itself_is_refused(bad):
    """A NaN id could be created but never found, so never cleared (a tensor compares elementwise)."""
    for call in (lambda: hr.recompute_session_ctx(bad).__enter__(), lambda: hr.clear_recompute_session(bad)):
        with pytest.raises(ValueError, match="does not compare equal to itself; use a str, int or tuple"):
            call()
    assert hr.live_sessions() == []


def test_entering_and_leaving_a_context_takes_constant_time_with_many_live_sessions(device, monkeypatch):
    """8,000 live sessions: entering and leaving each once changes one session's mode each
    time (hpr.session.scoped-ids). Counted, not timed: the writes of ``Session.mode``; the quadratic version
    (every enter and leave rewrote the mode of every live session: 9.7 s) made about 32
    million of them."""
    from hp_recompute.registry import Session

    slot = Session.__dict__["mode"]
    writes = [0]

    class CountedMode:
        def __get__(self, obj, owner=None):
            return slot.__get__(obj, owner) if obj is not None else self

        def __set__(self, obj, value):
            writes[0] += 1
            slot.__set__(obj, value)

    scope = hr.SessionScope("many")
    x = torch.randn(2, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(torch.sin, x).sum()
    scope.recompute_handle(handles[0], "bound")  # a bound frame, read after all the contexts
    monkeypatch.setattr(Session, "mode", CountedMode())
    for i in range(8000):
        with scope.recompute_session_ctx(("s", i), retain_on_unpack=True):
            pass
    monkeypatch.undo()
    assert len(scope.live_sessions()) == 8001
    assert 0 < writes[0] <= 3 * 8000, f"8,000 context entries wrote a session's mode {writes[0]} times"
    y.backward()  # no context open: the prefetched tensor is read (popped) without replay
    assert torch.allclose(x.grad, torch.cos(x)) and scope.stats()["replays"] == 1
    scope.clear_all()
