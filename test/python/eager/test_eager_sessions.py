"""Recompute sessions: prefetch, dx/dw sharing, isolation, errors, threads, nesting, policies."""

import contextvars
import gc
import os
import subprocess
import sys
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hp_recompute as hr
from hpr_eager_util import Counted, assert_bit_equal, make_blocks, params_of


class Stage:
    """Two checkpointed blocks of one pipeline stage, with per-block call counters."""

    def __init__(self, device, p=0.0, seed=0, dim=6, hidden=10):
        self.blocks = make_blocks(2, dim, hidden, device, p=p, seed=seed)
        self.params = params_of(self.blocks)
        self.counted = [Counted(b) for b in self.blocks]
        self.dim = dim
        self.device = device

    def input(self, batch=4, seed=100):
        torch.manual_seed(seed)
        return torch.randn(batch, self.dim, device=self.device, requires_grad=True)

    def forward(self, x, checkpointed=True):
        h = x
        for fn in self.counted:
            h = hr.checkpoint(fn, h) if checkpointed else fn(h)
        return h.pow(2).sum()

    def calls(self):
        return [c.calls for c in self.counted]

    def reference(self, x, rng_seed=None):
        """dx and dw of the same microbatch without checkpointing (same RNG if rng_seed)."""
        x = x.detach().clone().requires_grad_()
        if rng_seed is not None:
            torch.manual_seed(rng_seed)
        h = x
        for block in self.blocks:  # not the counted wrappers: references do not count
            h = block(h)
        return list(torch.autograd.grad(h.pow(2).sum(), [x] + self.params))


def _dx_dw(loss, x, params, sid):
    with hr.recompute_session_ctx(sid, retain_on_unpack=True):
        dx = torch.autograd.grad(loss, [x], retain_graph=True)
    with hr.recompute_session_ctx(sid, retain_on_unpack=False):
        dw = torch.autograd.grad(loss, params)
    return list(dx) + list(dw)


def test_prefetch_then_dx_then_dw_replays_each_block_once(device):
    stage = Stage(device, p=0.4)
    x = stage.input()
    want = stage.reference(x, rng_seed=5)
    torch.manual_seed(5)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    assert len(handles) == 2 and stage.calls() == [1, 1]
    for h in handles:
        hr.recompute_handle(h, "s0.mb0")
    assert stage.calls() == [2, 2]
    got = _dx_dw(loss, x, stage.params, "s0.mb0")
    assert stage.calls() == [2, 2]
    assert hr.session_stats("s0.mb0")["replays"] == 2
    hr.clear_recompute_session("s0.mb0")
    assert_bit_equal(got, want)
    assert hr.live_sessions() == []
    assert hr.stats()["session_replays"] == 2 and hr.stats()["plain_replays"] == 0


def test_session_without_prefetch_replays_once_on_first_unpack(device):
    stage = Stage(device, p=0.4, seed=1)
    x = stage.input()
    want = stage.reference(x, rng_seed=9)
    torch.manual_seed(9)
    loss = stage.forward(x)
    got = _dx_dw(loss, x, stage.params, ("s", 0))
    assert stage.calls() == [2, 2]
    hr.clear_recompute_session(("s", 0))
    assert_bit_equal(got, want)


def test_prefetch_does_not_advance_callers_rng(device):
    stage = Stage(device, p=0.5)
    x = stage.input()
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    cpu_before = torch.get_rng_state()
    cuda_before = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    for h in handles:
        hr.recompute_handle(h, "rng")
    assert torch.equal(torch.get_rng_state(), cpu_before)
    if cuda_before is not None:
        assert torch.equal(torch.cuda.get_rng_state(device), cuda_before)
    del loss


def test_two_chained_frames_share_one_session(device):
    stage = Stage(device, seed=2)
    x = stage.input()
    want = stage.reference(x)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    hr.recompute_handle(handles[1], "chain")  # prefetch only the second block
    got = _dx_dw(loss, x, stage.params, "chain")
    assert stage.calls() == [2, 2]
    assert hr.session_stats("chain")["replays"] == 2
    hr.clear_recompute_session("chain")
    assert_bit_equal(got, want)


def test_prefetch_twice_into_same_session_replays_once(device):
    stage = Stage(device)
    x = stage.input()
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    hr.recompute_handle(handles[0], "twice")
    hr.recompute_handle(handles[0], "twice")
    assert stage.calls()[0] == 2
    del loss


def test_three_iterations_with_distinct_ids_stay_isolated(device):
    stage = Stage(device, p=0.3, seed=3)
    for it in range(3):
        x = stage.input(seed=200 + it)
        want = stage.reference(x, rng_seed=it)
        before = stage.calls()
        torch.manual_seed(it)
        with hr.recompute_handle_collector_ctx() as handles:
            loss = stage.forward(x)
        sid = f"iter{it}"
        for h in handles:
            hr.recompute_handle(h, sid)
        got = _dx_dw(loss, x, stage.params, sid)
        assert [a - b for a, b in zip(stage.calls(), before)] == [2, 2]
        assert hr.live_sessions() == [sid]
        hr.clear_recompute_session(sid)
        assert_bit_equal(got, want)
    assert hr.live_sessions() == []


def test_partial_session_then_dw_without_session(device):
    stage = Stage(device, p=0.4, seed=4)
    x = stage.input()
    want = stage.reference(x, rng_seed=1)
    torch.manual_seed(1)
    loss = stage.forward(x)
    with hr.recompute_session_ctx("partial", retain_on_unpack=True):
        dx = torch.autograd.grad(loss, [x], retain_graph=True)
    hr.clear_recompute_session("partial")
    dw = torch.autograd.grad(loss, stage.params)  # plain backward: replays again, still exact
    assert stage.calls() == [3, 3]
    assert_bit_equal(list(dx) + list(dw), want)


def test_failed_prefetch_then_new_session_gives_correct_gradients(device):
    stage = Stage(device, p=0.4, seed=5)
    x = stage.input()
    want = stage.reference(x, rng_seed=2)
    fail = {"on": False}
    inner = stage.counted[1].fn

    def flaky(h):
        if fail["on"]:
            stage.blocks[1].fc1(h)  # saves what the block saves first: stored before the failure
            raise OSError("device lost during replay")
        return inner(h)

    stage.counted[1].fn = flaky
    torch.manual_seed(2)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    fail["on"] = True
    with pytest.raises(OSError, match="device lost"):
        hr.recompute_handle(handles[1], "bad")
    assert hr.session_stats("bad") is None and hr.live_sessions() == []
    fail["on"] = False
    for h in handles:
        hr.recompute_handle(h, "good")
    got = _dx_dw(loss, x, stage.params, "good")
    hr.clear_recompute_session("good")
    assert_bit_equal(got, want)


def test_session_found_when_backward_runs_on_another_thread(device):
    marker = contextvars.ContextVar("caller_only", default="unset")
    stage = Stage(device, p=0.4, seed=6)
    x = stage.input()
    want = stage.reference(x, rng_seed=4)
    torch.manual_seed(4)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    result, seen = {}, {}

    def worker(key, inputs):
        seen[key] = marker.get()  # proves the thread does not share the caller's context
        result[key] = torch.autograd.grad(loss, inputs, retain_graph=(key == "dx"))

    marker.set("caller")
    hr.recompute_handle(handles[0], "thread")
    with hr.recompute_session_ctx("thread", retain_on_unpack=True):
        t = threading.Thread(target=worker, args=("dx", [x]))
        t.start()
        t.join()
    with hr.recompute_session_ctx("thread"):
        t = threading.Thread(target=worker, args=("dw", stage.params))
        t.start()
        t.join()
    assert seen == {"dx": "unset", "dw": "unset"}
    assert stage.calls() == [2, 2]
    hr.clear_recompute_session("thread")
    assert_bit_equal(list(result["dx"]) + list(result["dw"]), want)


_CONCURRENT_FAILING_PREFETCHES = r"""
import threading, time
import torch
import hp_recompute as hr
from hp_recompute.registry import REGISTRY

calls = []
failing = threading.Event()

def fn(x):
    y = x.sin()
    if failing.is_set():
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            # Fail only once the other prefetch holds the registry lock (it then waits for
            # this frame's lock, which this replay holds).
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and REGISTRY.lock.acquire(blocking=False):
                REGISTRY.lock.release()
                time.sleep(0.002)
        raise OSError("replay failed")
    return y.cos()

x = torch.randn(3, requires_grad=True)
with hr.recompute_handle_collector_ctx() as handles:
    y = hr.checkpoint(fn, x)
failing.set()
errors = []

def prefetch():
    try:
        hr.recompute_handle(handles[0], "s")
    except OSError as e:
        errors.append(str(e))

first = threading.Thread(target=prefetch, daemon=True)
first.start()
while not calls:
    time.sleep(0.001)
second = threading.Thread(target=prefetch, daemon=True)
second.start()
for t in (first, second):
    t.join(5)
print("alive", [t.is_alive() for t in (first, second)])
print("errors", errors)
print("replays", len(calls))
"""


def test_two_threads_prefetching_one_failing_handle_do_not_deadlock():
    """The failure path of a prefetch must take the registry lock after the frame lock is released.

    Run in a fresh interpreter: a deadlock would leave threads holding the registry lock,
    which would hang every later test of this process.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(hr.__file__)), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _CONCURRENT_FAILING_PREFETCHES], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "alive [False, False]", proc.stdout
    assert lines[1] == "errors ['replay failed', 'replay failed']"
    assert lines[2] == "replays 2"  # the second prefetch replays anew: the failed binding was undone


def test_exception_inside_dx_then_clear_and_recover(device):
    stage = Stage(device, p=0.4, seed=7)
    x = stage.input()
    want = stage.reference(x, rng_seed=6)
    armed = {"on": True}

    def tripwire(grad):
        if armed["on"]:
            raise ValueError("tripwire in dx")
        return grad

    torch.manual_seed(6)
    with hr.recompute_handle_collector_ctx() as handles:
        h = hr.checkpoint(stage.counted[0], x)
        h.register_hook(tripwire)  # fires in the middle of dx, between the two blocks
        loss = hr.checkpoint(stage.counted[1], h).pow(2).sum()
    for handle in handles:
        hr.recompute_handle(handle, "err")
    try:
        with pytest.raises(ValueError, match="tripwire in dx"):
            with hr.recompute_session_ctx("err", retain_on_unpack=True):
                torch.autograd.grad(loss, [x], retain_graph=True)
    finally:
        hr.clear_recompute_session("err")
    assert hr.live_sessions() == []
    armed["on"] = False
    got = _dx_dw(loss, x, stage.params, "retry")  # the context exited cleanly: a new one may open
    hr.clear_recompute_session("retry")
    assert stage.calls() == [3, 3]  # forward, "err" prefetch, "retry" replay
    assert_bit_equal(got, want)


def _outer_with_nested(lin):
    inner = Counted(lambda t: torch.tanh(lin(t)))

    def outer(t):
        return hr.checkpoint(inner, t.sin()).cos()

    return Counted(outer), inner


def test_prefetch_of_outer_checkpoint_with_nested_one_raises(device):
    lin = torch.nn.Linear(4, 4).to(device)
    outer, inner = _outer_with_nested(lin)
    x = torch.randn(3, 4, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(outer, x).sum()
    # Handles are appended when a forward returns: the nested inner one comes first.
    assert len(handles) == 2 and "outer" in repr(handles[1])
    with pytest.raises(hr.CheckpointError, match="contains a nested checkpoint"):
        hr.recompute_handle(handles[1], "nested")
    assert outer.calls == 1 and hr.live_sessions() == []
    with pytest.raises(RuntimeError, match="contains a nested checkpoint"):
        with hr.recompute_session_ctx("nested"):
            torch.autograd.grad(y, [x])
    del y


def test_nested_checkpoint_without_session_matches_plain(device):
    lin = torch.nn.Linear(4, 4).to(device)
    outer, inner = _outer_with_nested(lin)
    x = torch.randn(3, 4, device=device, requires_grad=True)
    plain = torch.autograd.grad(torch.tanh(lin(x.sin())).cos().sum(), [x] + list(lin.parameters()))
    y = hr.checkpoint(outer, x).sum()
    ours = torch.autograd.grad(y, [x] + list(lin.parameters()))
    assert_bit_equal(ours, plain)
    # inner runs in the forward, in the replay of outer (which rebuilds it as a new
    # checkpoint), and in the replay of its own forward frame, whose holders the
    # original graph unpacks.
    assert outer.calls == 2 and inner.calls == 3


class _CacheMatmuls(TorchDispatchMode):
    """Selective checkpoint policy: forward stores matmul outputs, the replay reuses them."""

    MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)

    def __init__(self, store, replay, counter):
        super().__init__()
        self.store, self.replay, self.counter = store, replay, counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.MATMULS:
            if self.replay:
                return self.store.pop(0)
            self.counter["matmuls"] += 1
            out = func(*args, **(kwargs or {}))
            self.store.append(out.detach())
            return out
        return func(*args, **(kwargs or {}))


def test_selective_checkpoint_policy_with_prefetch_dx_dw(device):
    stage = Stage(device, seed=8)
    x = stage.input()
    want = stage.reference(x)
    counter = {"matmuls": 0}

    def policy():
        cache = []
        return _CacheMatmuls(cache, False, counter), _CacheMatmuls(cache, True, counter)

    with hr.recompute_handle_collector_ctx() as handles:
        h = x
        for fn in stage.counted:
            h = hr.checkpoint(fn, h, context_fn=policy)
        loss = h.pow(2).sum()
    assert counter["matmuls"] == 4
    for handle in handles:
        hr.recompute_handle(handle, "sac")
    got = _dx_dw(loss, x, stage.params, "sac")
    hr.clear_recompute_session("sac")
    assert counter["matmuls"] == 4  # replays reused every cached matmul
    assert stage.calls() == [2, 2]
    assert_bit_equal(got, want)


def test_clearing_twice_and_unknown_ids_is_safe(device):
    stage = Stage(device)
    x = stage.input()
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    hr.recompute_handle(handles[0], "c")
    hr.clear_recompute_session("c")
    hr.clear_recompute_session("c")
    hr.clear_recompute_session("never-created")
    assert hr.live_sessions() == []
    # The frame serves a new session after the clear.
    got = _dx_dw(loss, x, stage.params, "c")
    assert stage.calls() == [3, 2]
    hr.clear_recompute_session("c")
    assert_bit_equal(got, stage.reference(x))


def test_bad_arguments_raise_value_error(device):
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(torch.sin, x)
    with pytest.raises(ValueError, match="^hp_recompute: recompute_handle: expected a handle collected by"):
        hr.recompute_handle(object(), "s")
    with pytest.raises(ValueError, match="^hp_recompute: RecomputeHandle is created by checkpoint"):
        hr.RecomputeHandle(handles[0].frame(), _token=object())
    with pytest.raises(ValueError, match="^hp_recompute: recompute_handle: session_id must be hashable, got list"):
        hr.recompute_handle(handles[0], ["s"])
    with pytest.raises(ValueError, match="^hp_recompute: recompute_session_ctx: session_id must be hashable"):
        with hr.recompute_session_ctx({"a": 1}):
            pass
    with pytest.raises(ValueError, match="retain_on_unpack must be a bool, got int"):
        with hr.recompute_session_ctx("s", retain_on_unpack=1):
            pass
    with pytest.raises(ValueError, match="^hp_recompute: clear_recompute_session: session_id must be hashable"):
        hr.clear_recompute_session([1])
    assert hr.live_sessions() == []
    del y


def test_session_id_is_required_and_not_none(device):
    with pytest.raises(TypeError):
        with hr.recompute_session_ctx():  # no default on purpose
            pass
    for call in (
        lambda: hr.recompute_session_ctx(None).__enter__(),
        lambda: hr.clear_recompute_session(None),
    ):
        with pytest.raises(ValueError, match="session_id must not be None"):
            call()
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(torch.sin, x)
    with pytest.raises(ValueError, match="session_id must not be None"):
        hr.recompute_handle(handles[0], None)
    del y
    gc.collect()
    # The graph behind the handle is gone now: the bad argument is still what is reported.
    assert handles[0].frame() is None
    with pytest.raises(ValueError, match="session_id must not be None"):
        hr.recompute_handle(handles[0], None)


def test_session_contexts_do_not_nest_on_one_thread():
    with hr.recompute_session_ctx("a") as sid:
        assert sid == "a"
        nested = r"recompute_session_ctx\('b'\) entered while recompute_session_ctx\('a'\) is open on this thread"
        with pytest.raises(hr.CheckpointError, match=nested):
            with hr.recompute_session_ctx("b"):
                pass
    with hr.recompute_session_ctx("b"):  # the first context still closed cleanly
        pass


def _in_other_thread(fn):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not t.is_alive()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_one_session_cannot_be_open_on_two_threads_at_once():
    with hr.recompute_session_ctx("a"):
        with pytest.raises(hr.CheckpointError, match=r"recompute_session_ctx\('a'\) is already open on another thread"):
            _in_other_thread(lambda: hr.recompute_session_ctx("a").__enter__())


def test_two_threads_each_in_its_own_session_at_the_same_time(device):
    """Two microbatches backwarded concurrently, each thread inside its own context
    (hpr.session.one-context-per-thread)."""
    # p=0: the CPU generator is process-wide, so dropout replays racing on two threads would
    # interleave its state (torch's own checkpoint shares that limit).
    stages = [Stage(device, p=0.0, seed=20 + i) for i in range(2)]
    inputs = [stage.input(seed=30 + i) for i, stage in enumerate(stages)]
    wants = [stage.reference(x, rng_seed=40 + i) for i, (stage, x) in enumerate(zip(stages, inputs))]
    losses = []
    for i, (stage, x) in enumerate(zip(stages, inputs)):
        torch.manual_seed(40 + i)
        losses.append(stage.forward(x))  # no prefetch: each backward binds to its thread's context
    both_inside = threading.Barrier(2, timeout=30)
    results = [None, None]

    def microbatch(i):
        sid = f"mb{i}"
        with hr.recompute_session_ctx(sid, retain_on_unpack=True):
            both_inside.wait()  # both contexts are open now
            dx = torch.autograd.grad(losses[i], [inputs[i]], retain_graph=True)
            both_inside.wait()
        with hr.recompute_session_ctx(sid):
            dw = torch.autograd.grad(losses[i], stages[i].params)
        results[i] = (list(dx) + list(dw), hr.session_stats(sid)["replays"])
        hr.clear_recompute_session(sid)

    threads = [threading.Thread(target=microbatch, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    for i in range(2):
        grads, replays = results[i]
        assert replays == 2  # each of the two blocks replayed once, into its own session
        assert stages[i].calls() == [2, 2]
        assert_bit_equal(grads, wants[i])
    assert hr.live_sessions() == []


def test_session_unpack_hot_path_makes_no_lookups_and_takes_no_lock(device):
    """hpr.session.hot-path, checked by watching every call the unpack hook makes (sys.setprofile).

    A prefetched session is consumed by dx (retained) and dw (popped); while autograd
    unpacks, nothing may call ContextVar.get, acquire a lock, or enter the slow path.
    """
    stage = Stage(device, seed=9)
    x = stage.input()
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    for h in handles:
        hr.recompute_handle(h, "hot")
    calls = []
    inside = []
    unpacks = []

    def profiler(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "unpack_saved":
            inside.append(True)
            unpacks.append(True)
        elif event == "return" and frame.f_code.co_name == "unpack_saved":
            inside.pop()
        elif inside and event in ("call", "c_call"):
            calls.append(frame.f_code.co_name if event == "call" else getattr(arg, "__qualname__", repr(arg)))

    for retain, inputs in ((True, [x]), (False, stage.params)):
        with hr.recompute_session_ctx("hot", retain_on_unpack=retain):
            sys.setprofile(profiler)
            try:
                torch.autograd.grad(loss, inputs, retain_graph=retain)
            finally:
                sys.setprofile(None)
    hr.clear_recompute_session("hot")
    assert stage.calls() == [2, 2]
    assert len(unpacks) >= 2 * len(handles), "the profiler saw too few unpacks to judge the hot path"
    assert calls == [], f"the unpack hot path called {sorted(set(calls))}"


def test_retained_bytes_count_each_storage_once(device):
    """A block that saves a tensor and a view of it (s and s.t() for s @ s.t()) holds s once."""

    def block(a):
        s = a.sin()
        return (s @ s.t()).sum()

    x = torch.randn(5, 3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = hr.checkpoint(block, x)
    hr.recompute_handle(handles[0], "views")
    st = hr.session_stats("views")
    # sin saves its input x; mm saves s and s.t(): three tensors over two storages
    assert st["retained_tensors"] == 3
    assert st["retained_bytes"] == 2 * x.numel() * x.element_size()
    with hr.recompute_session_ctx("views"):
        loss.backward()
    hr.clear_recompute_session("views")


def test_frame_cannot_be_bound_to_two_sessions(device):
    stage = Stage(device)
    x = stage.input()
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    hr.recompute_handle(handles[0], "A")
    with pytest.raises(hr.CheckpointError, match="bound to session 'A' and cannot join session 'B'"):
        hr.recompute_handle(handles[0], "B")
    assert hr.live_sessions() == ["A"]
    with pytest.raises(RuntimeError, match="belongs to session 'A' but is unpacked inside recompute_session_ctx\\('B'\\)"):
        with hr.recompute_session_ctx("B"):
            torch.autograd.grad(loss, [x], retain_graph=True)
    hr.clear_recompute_session("A")
    hr.recompute_handle(handles[0], "B")  # after the clear it may join another session
    del loss


def test_second_consumer_without_retain_raises(device):
    stage = Stage(device)
    x = stage.input()
    with hr.recompute_handle_collector_ctx() as handles:
        loss = stage.forward(x)
    for h in handles:
        hr.recompute_handle(h, "noretain")
    with hr.recompute_session_ctx("noretain"):
        torch.autograd.grad(loss, [x], retain_graph=True)
    with pytest.raises(RuntimeError, match="already consumed by a backward that did not retain it"):
        with hr.recompute_session_ctx("noretain"):
            torch.autograd.grad(loss, stage.params)


def test_use_after_clear_inside_context_raises(device):
    stage = Stage(device)
    x = stage.input()
    loss = stage.forward(x)
    with hr.recompute_session_ctx("gone", retain_on_unpack=True):
        hr.clear_recompute_session("gone")
        with pytest.raises(RuntimeError, match="session 'gone' was cleared inside its own recompute_session_ctx"):
            torch.autograd.grad(loss, [x], retain_graph=True)
    assert hr.live_sessions() == []


def test_dead_handle_raises(device):
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(torch.sin, x).sum()
    y.backward()  # frees the graph and with it the frame
    del y
    with pytest.raises(hr.CheckpointError, match="the checkpoint behind this handle is gone"):
        hr.recompute_handle(handles[0], "late")
    assert "freed" in repr(handles[0])


# -- regions that save nothing (hpr.session.forward-frame) ------------------------------------

_NOTHING_SAVED = {
    "identity": lambda a: a,
    "add_one": lambda a: a + 1,
    "view": lambda a: a.view(a.shape),
    "clone": lambda a: a.clone(),
    "times_two": lambda a: a * 2.0,
    "dropout0": torch.nn.Dropout(0.0),
}


@pytest.mark.parametrize("kind", sorted(_NOTHING_SAVED))
def test_a_region_that_saves_nothing_is_a_no_op_recompute(device, kind):
    """A valid plan prefetches every region; one with no saved tensor has nothing to replay."""
    from hpr_eager_util import count_saved

    region = _NOTHING_SAVED[kind]
    if count_saved(region, torch.randn(4, 6, device=device, requires_grad=True)) != {}:
        pytest.skip(f"{kind} saves a tensor on torch {torch.__version__} (1.13 saves the scalar of a * 2.0)")
    stage = Stage(device, seed=11)
    x = stage.input()
    want = None
    for checkpointed in (False, True):
        with hr.recompute_handle_collector_ctx() as handles:
            h = stage.counted[0](x) if not checkpointed else hr.checkpoint(stage.counted[0], x)
            h = region(h) if not checkpointed else hr.checkpoint(region, h)
            h = stage.counted[1](h) if not checkpointed else hr.checkpoint(stage.counted[1], h)
            loss = h.pow(2).sum()
        if not checkpointed:
            want = list(torch.autograd.grad(loss, [x] + stage.params))
            continue
        assert len(handles) == 3 and handles[1].saves_nothing and not handles[0].saves_nothing
        for handle in handles:
            hr.recompute_handle(handle, "s1.mb0")
        hr.recompute_handle(handles[1], "s1.mb0")  # again: still nothing to do
        got = _dx_dw(loss, x, stage.params, "s1.mb0")
        assert hr.session_stats("s1.mb0")["replays"] == 2  # the two real blocks, once each
        hr.clear_recompute_session("s1.mb0")
        assert_bit_equal(got, want)
    assert hr.stats()["prefetches"] == 4 and hr.live_sessions() == []


def test_a_handle_whose_graph_was_freed_by_a_backward_still_raises(device):
    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = hr.checkpoint(torch.sin, x).sum()
    loss.backward()  # frees the graph, and the checkpoint's saved tensors with it
    with pytest.raises(hr.CheckpointError, match="its autograd graph was freed"):
        hr.recompute_handle(handles[0], "late")
    assert hr.live_sessions() == []


# -- recompute_handle from inside the replayed function ---------------------------------------


def test_prefetching_a_checkpoint_from_inside_its_own_replay_is_a_clear_error(device):
    """Not a no-op: the caller relies on the tensors being in the session on return, and
    they are not while the replay runs. It used to recurse until RecursionError."""
    handles = []
    armed = {"sid": None}

    def fn(a):
        if armed["sid"] is not None:
            hr.recompute_handle(handles[0], armed["sid"])
        return a.sin().cos()

    x = torch.randn(3, device=device, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as collected:
        loss = hr.checkpoint(fn, x).sum()
    handles.extend(collected)
    armed["sid"] = "self"
    with pytest.raises(hr.CheckpointError, match=r"^hp_recompute: recompute_handle\(<handle of 'test_prefetching.*"
                       r"fn'>, 'self'\) was called from inside the replay of that checkpoint \(running for session "
                       r"'self'\); a checkpointed function cannot prefetch itself"):
        hr.recompute_handle(handles[0], "self")
    assert hr.live_sessions() == []  # the failed prefetch left nothing behind
    # in a plain backward (torch 1.13 turns the hook's error into a RuntimeError with our text)
    with pytest.raises(RuntimeError, match=r"called from inside the replay of that checkpoint \(running for a "
                       r"backward outside any session\)"):
        torch.autograd.grad(loss, [x], retain_graph=True)
    armed["sid"] = None
    (g,) = torch.autograd.grad(loss, [x])  # the frame still serves a plain backward
    assert torch.allclose(g, -torch.sin(torch.sin(x)) * torch.cos(x))
    assert hr.live_sessions() == []
