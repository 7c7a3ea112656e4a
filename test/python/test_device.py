"""Devices and streams (hpr.session.any-device, hpr.session.side-stream; NOTE in checkpoint.py).

The protocol of a side-stream prefetch (the side stream waits for the caller's, the
replay is queued on it, its first consumer waits for its event) is checked on any
machine with a stand-in device whose streams log what is done to them. The tests that
need the real thing (a CUDA device: gradients, dropout, autocast, the allocator's peak)
skip without one; bench/gpu/run.sh runs them when a device is lent.
"""

import os
import sys

# cuBLAS promises bit-identical results only while one stream is active, unless its
# workspace is configured (CUDA's "results reproducibility"); a replay on a side stream
# is compared bit for bit below. Read when cuBLAS starts, so set before any matmul.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest  # noqa: E402
import torch  # noqa: E402

import hp_recompute as hr  # noqa: E402
from hp_recompute import replay_state  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (bench/gpu/run.sh runs it on one)")


class Block(torch.nn.Module):
    """Linear -> GELU -> dropout -> Linear with a residual; counts its calls."""

    def __init__(self, dim: int, p: float = 0.0) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)
        self.p = p
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = torch.nn.functional.dropout(torch.nn.functional.gelu(self.fc1(x)), self.p, training=True)
        return x + self.fc2(h)


def blocks(n: int, dim: int, device, p: float = 0.0):
    torch.manual_seed(0)
    return [Block(dim, p).to(device) for _ in range(n)]


def params_of(bs):
    return [q for b in bs for q in b.parameters()]


def plain_grads(bs, x0, seed: int, autocast=None):
    """Gradients of the stage without any checkpoint (the reference), from RNG seed ``seed``."""
    torch.manual_seed(seed)
    x = x0.detach().clone().requires_grad_()
    with autocast if autocast is not None else _null():
        h = x
        for b in bs:
            h = b(h)
        loss = h.float().pow(2).mean()
    return torch.autograd.grad(loss, [x] + params_of(bs))


def _null():
    import contextlib

    return contextlib.nullcontext()


def session_grads(bs, x0, seed: int, scope, sid, stream, autocast=None, between=None):
    """The same stage checkpointed: prefetch on ``stream``, dx (retained), dw, clear."""
    torch.manual_seed(seed)
    x = x0.detach().clone().requires_grad_()
    with autocast if autocast is not None else _null():
        with hr.recompute_handle_collector_ctx() as handles:
            h = x
            for b in bs:
                h = hr.checkpoint(b, h)
        loss = h.float().pow(2).mean()
    for handle in handles:
        scope.recompute_handle(handle, sid, stream=stream)
    if between is not None:
        between()  # work the replay may overlap
    try:
        with scope.recompute_session_ctx(sid, retain_on_unpack=True):
            (dx,) = torch.autograd.grad(loss, [x], retain_graph=True)
        with scope.recompute_session_ctx(sid):
            dw = torch.autograd.grad(loss, params_of(bs))
    finally:
        scope.clear_recompute_session(sid)
    return (dx,) + tuple(dw)


def assert_bit_equal(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"gradient {i} differs: max abs diff {(a - b).abs().max().item()}"


# -- any machine: the stream argument on a device without streams ------------------------------


def test_stream_none_is_the_default_prefetch():
    bs = blocks(2, 8, "cpu")
    x0 = torch.randn(4, 8)
    want = plain_grads(bs, x0, seed=1)
    for b in bs:
        b.calls = 0
    scope = hr.SessionScope("stream none")
    got = session_grads(bs, x0, 1, scope, "s0", stream=None)
    assert_bit_equal(got, want)
    assert [b.calls for b in bs] == [2, 2]  # forward + one replay each
    assert scope.stats()["replays"] == 2 and scope.live_sessions() == []


@pytest.mark.parametrize("stream", ["cuda", 0, object()], ids=["str", "int", "object"])
def test_cpu_checkpoint_refuses_any_stream(stream):
    x = torch.randn(3, 3, requires_grad=True)
    scope = hr.SessionScope("cpu stream")
    with hr.recompute_handle_collector_ctx() as handles:
        loss = hr.checkpoint(lambda t: t.sin().cos(), x).sum()
    with pytest.raises(hr.CheckpointError, match=r"^hp_recompute: .*cpu, which has no streams.*pass stream=None"):
        scope.recompute_handle(handles[0], "s0", stream=stream)
    assert scope.live_sessions() == []  # refused before any session was made
    assert handles[0].frame().session is None
    loss.backward()  # the checkpoint still serves a plain backward


@pytest.mark.parametrize("make_stream,message", [
    pytest.param(lambda: torch.cpu.Stream(), "no streams", id="cpu-stream",
                 marks=pytest.mark.skipif(not hasattr(torch.cpu, "Stream"),
                                          reason="torch.cpu.Stream is new in torch 2.x")),
    pytest.param(lambda: torch.cuda.Stream(), "cpu, which has no streams", id="cuda-stream",
                 marks=needs_cuda),
])
def test_a_stream_for_a_cpu_checkpoint_is_refused(make_stream, message: str) -> None:
    x = torch.randn(3, 3, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(lambda t: t.sin(), x)
    with pytest.raises(hr.CheckpointError, match=message):
        hr.SessionScope("stream for a cpu checkpoint").recompute_handle(handles[0], "s0", stream=make_stream())
    y.sum().backward()
    assert torch.equal(x.grad, x.detach().cos())


# -- any machine: the protocol, on a stand-in device with streams ------------------------------


class FakeEvent:
    def __init__(self, stream: "FakeStream", number: int) -> None:
        self.stream, self.number = stream, number

    def __repr__(self) -> str:
        return f"event{self.number}@{self.stream.name}"


class FakeStream:
    """Logs what the runtime asks of a stream (into ``log``)."""

    def __init__(self, name: str, log: list, device: str = "cpu") -> None:
        self.name, self.log, self.device = name, log, torch.device(device)
        self.events = 0

    def record_event(self):
        self.events += 1
        event = FakeEvent(self, self.events)
        self.log.append(("record_event", self.name, repr(event)))
        return event

    def wait_event(self, event) -> None:
        self.log.append(("wait_event", self.name, repr(event)))

    def wait_stream(self, other: "FakeStream") -> None:
        self.log.append(("wait_stream", self.name, other.name))

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


@pytest.fixture
def stand_in(monkeypatch):
    """The CPU as a device with streams: ``main`` is every thread's current stream."""
    log: list = []
    main = FakeStream("main", log)
    current = [main]

    class OnStream:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            log.append(("enter", self.stream.name))
            current.append(self.stream)

        def __exit__(self, *exc):
            current.pop()
            log.append(("exit", self.stream.name))

    monkeypatch.setattr(replay_state, "has_streams", lambda device_type: True)
    monkeypatch.setattr(replay_state, "current_stream", lambda device: current[-1])
    monkeypatch.setattr(replay_state, "on_stream", OnStream)
    monkeypatch.setattr(
        replay_state, "record_stream", lambda tensor, stream: log.append(("record_stream", stream.name))
    )
    return log, main, current


class Consumed(torch.autograd.Function):
    """Saves its input for backward and logs when a backward reads it."""

    log: list = []
    current: list = []

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 1.5

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        Consumed.log.append(("consumed", Consumed.current[-1].name))
        return g * 1.5 + 0 * x


def test_side_stream_prefetch_protocol(stand_in):
    """hpr.session.side-stream: the side stream waits for the caller's; the replay runs under it; its event
    is waited for by the first consumer (before it reads), and only by that one."""
    log, main, current = stand_in
    Consumed.log, Consumed.current = log, current
    side = FakeStream("side", log)
    ran_on = []

    def block(t):
        ran_on.append(current[-1].name)
        return Consumed.apply(t.sin())

    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 3, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = (hr.checkpoint(block, x) @ w).sum()
    scope = hr.SessionScope("protocol")
    scope.recompute_handle(handles[0], "s0", stream=side)
    assert ran_on == ["main", "side"]  # forward on the caller's stream, replay on the side stream
    prefetch = [e for e in log if e[0] != "record_stream"]
    assert prefetch == [("wait_stream", "side", "main"), ("enter", "side"), ("exit", "side"),
                        ("record_event", "side", "event1@side")]
    assert ("record_stream", "side") in log  # the input, for the allocator
    del log[:]
    with scope.recompute_session_ctx("s0", retain_on_unpack=True):
        (dx,) = torch.autograd.grad(loss, [x], retain_graph=True)
    waits = [i for i, e in enumerate(log) if e[0] == "wait_event"]
    assert [log[i] for i in waits] == [("wait_event", "main", "event1@side")]
    assert waits[0] < log.index(("consumed", "main")), "the consumer read the tensors before waiting"
    assert ("record_stream", "main") in log  # replayed tensors recorded on the consumer's stream
    del log[:]
    with scope.recompute_session_ctx("s0"):
        (dw,) = torch.autograd.grad(loss, [w])
    scope.clear_recompute_session("s0")
    assert not [e for e in log if e[0] in ("wait_event", "record_stream")], "a second consumer waited again"
    assert scope.stats()["replays"] == 1
    want_dx, want_dw = torch.autograd.grad(((block(x)) @ w).sum(), [x, w])
    assert torch.equal(dx, want_dx) and torch.equal(dw, want_dw)


def test_clear_waits_for_an_unconsumed_side_stream_replay(stand_in):
    log, main, _ = stand_in
    side = FakeStream("side", log)
    x = torch.randn(4, 3, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = hr.checkpoint(lambda t: t.sin().exp(), x).sum()
    scope = hr.SessionScope("clear waits")
    scope.recompute_handle(handles[0], "s0", stream=side)
    assert scope.session_stats("s0")["retained_tensors"] > 0
    del log[:]
    scope.clear_recompute_session("s0")
    assert ("wait_event", "main", "event1@side") in log
    frame = handles[0].frame()
    assert frame.pending is None and frame.retained() == []
    loss.backward()  # a plain backward afterwards replays on the caller's stream
    assert x.grad is not None


def test_hot_path_again_after_the_first_consumer(stand_in):
    """hpr.session.hot-path with hpr.session.side-stream: once the first consumer waited, unpacks make no call."""
    log, main, current = stand_in
    side = FakeStream("side", log)
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 3, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = (hr.checkpoint(lambda t: t.sin().cos(), x) @ w).sum()
    scope = hr.SessionScope("hot after wait")
    scope.recompute_handle(handles[0], "s0", stream=side)
    with scope.recompute_session_ctx("s0", retain_on_unpack=True):
        torch.autograd.grad(loss, [x], retain_graph=True)  # the first consumer waits
    calls, inside = [], []

    def profiler(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "unpack_saved":
            inside.append(True)
        elif event == "return" and frame.f_code.co_name == "unpack_saved":
            inside.pop()
        elif inside and event in ("call", "c_call"):
            calls.append(frame.f_code.co_name if event == "call" else getattr(arg, "__qualname__", repr(arg)))

    with scope.recompute_session_ctx("s0", retain_on_unpack=True):
        sys.setprofile(profiler)
        try:
            torch.autograd.grad(loss, [x], retain_graph=True)
        finally:
            sys.setprofile(None)
    scope.clear_recompute_session("s0")
    assert calls == [], f"the unpack hot path called {sorted(set(calls))}"


def test_stream_of_another_device_is_refused(stand_in):
    log, _, _ = stand_in
    x = torch.randn(3, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        y = hr.checkpoint(lambda t: t.sin(), x)
    scope = hr.SessionScope("other device")
    with pytest.raises(hr.CheckpointError, match=r"^hp_recompute: .*is on meta but the checkpoint's inputs are on cpu"):
        scope.recompute_handle(handles[0], "s0", stream=FakeStream("elsewhere", log, device="meta"))
    with pytest.raises(ValueError, match=r"^hp_recompute: .*stream must be None or a stream"):
        scope.recompute_handle(handles[0], "s0", stream="side")
    assert scope.live_sessions() == [] and log == []
    del y


def test_peak_meter_picks_the_profiler_on_cpu():
    from hp_recompute.runner.memory import AllocatorPeak, DeviceAllocatorPeak, peak_meter

    meter = peak_meter("cpu")
    assert isinstance(meter, AllocatorPeak)
    with meter:
        t = torch.empty(1 << 20, dtype=torch.uint8)
        del t
    assert meter.peak >= 1 << 20 and meter.net < 1 << 20
    with pytest.raises(RuntimeError, match="^hp_recompute: meta has no allocator statistics"):
        DeviceAllocatorPeak("meta")


def test_a_meter_inside_another_is_refused_and_the_outer_one_still_counts():
    """A profiler started inside another silently stops the outer one's allocator accounting;
    the meter refuses to start inside one, and the outer window measures as if it had not tried."""
    from hp_recompute.runner.memory import AllocatorPeak

    with AllocatorPeak() as outer:
        with pytest.raises(RuntimeError, match="^hp_recompute: AllocatorPeak: a profiler is already running"):
            with AllocatorPeak():
                pass
        t = torch.empty(1 << 20, dtype=torch.uint8)
        del t
    assert outer.peak >= 1 << 20 and outer.net < 1 << 20


def test_measuring_the_cpu_peak_imports_no_compiler():
    """A rank measures its step under the profiler once, in a fresh process: the meter must not
    pull in inductor (torch.profiler.profile's start imports torch._inductor on torch 2.13,
    seconds of CPU per rank)."""
    import subprocess

    code = ("import sys, torch\nfrom hp_recompute.runner.memory import AllocatorPeak\n"
            "with AllocatorPeak() as m:\n    t = torch.ones(1 << 16)\n"
            "print(m.peak >= 1 << 18, 'torch._inductor' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"], proc.stdout


def test_a_block_freed_on_an_unprofiled_thread_is_freed_where_its_address_comes_back():
    """gloo's threads drop FSDP's buffers where the profiler reports no free: an address
    allocated again with no free between was freed, at the latest, just before."""
    from hp_recompute.runner.memory import allocated_peak

    # (time, address, bytes): A 100 at 0x10, B 50 at 0x20, A's free unseen, 0x10 again (80), B freed
    events = [(1, 0x10, 100), (2, 0x20, 50), (3, 0x10, 80), (4, 0x20, -50)]
    assert allocated_peak(events) == (150, 80)
    assert allocated_peak(events[:2] + [(3, 0x30, 80)] + events[3:]) == (230, 180)  # no reuse: no free


# -- a CUDA device -------------------------------------------------------------------------------


@needs_cuda
def test_side_stream_prefetch_same_gradients_one_replay():
    dev = torch.device("cuda")
    bs = blocks(3, 256, dev)
    x0 = torch.randn(64, 256, device=dev)
    want = plain_grads(bs, x0, seed=3)
    for b in bs:
        b.calls = 0
    side = torch.cuda.Stream()
    big = torch.randn(2048, 2048, device=dev)
    scope = hr.SessionScope("cuda side")
    got = session_grads(bs, x0, 3, scope, "s0", stream=side, between=lambda: big @ big)
    torch.cuda.synchronize()
    assert_bit_equal(got, want)
    assert [b.calls for b in bs] == [2, 2, 2]
    assert scope.stats()["replays"] == 3 and scope.live_sessions() == []


@needs_cuda
def test_dropout_bit_exact_across_a_side_stream_replay():
    dev = torch.device("cuda")
    bs = blocks(2, 128, dev, p=0.5)
    x0 = torch.randn(32, 128, device=dev)
    want = plain_grads(bs, x0, seed=5)
    side = torch.cuda.Stream()
    scope = hr.SessionScope("cuda dropout")
    torch.manual_seed(5)
    x = x0.detach().clone().requires_grad_()
    with hr.recompute_handle_collector_ctx() as handles:
        h = x
        for b in bs:
            h = hr.checkpoint(b, h)
        loss = h.pow(2).mean()
    before = torch.cuda.get_rng_state()
    for handle in handles:
        scope.recompute_handle(handle, "s0", stream=side)
    assert torch.equal(torch.cuda.get_rng_state(), before), "the replay moved the caller's CUDA RNG stream"
    with scope.recompute_session_ctx("s0", retain_on_unpack=True):
        dx = torch.autograd.grad(loss, [x], retain_graph=True)
    with scope.recompute_session_ctx("s0"):
        dw = torch.autograd.grad(loss, params_of(bs))
    scope.clear_recompute_session("s0")
    assert_bit_equal(dx + dw, want)


@needs_cuda
def test_autocast_on_the_device_across_a_side_stream_replay():
    dev = torch.device("cuda")
    bs = blocks(2, 128, dev)
    x0 = torch.randn(32, 128, device=dev)
    want = plain_grads(bs, x0, seed=7, autocast=torch.autocast("cuda", dtype=torch.bfloat16))
    scope = hr.SessionScope("cuda autocast")
    # the prefetch runs outside autocast: the replay must restore the forward's
    got = session_grads(bs, x0, 7, scope, "s0", stream=torch.cuda.Stream(),
                        autocast=torch.autocast("cuda", dtype=torch.bfloat16))
    assert_bit_equal(got, want)


@needs_cuda
def test_allocator_peak_of_a_session():
    """The allocator sees the session's replayed tensors appear with the prefetch and go with the clear."""
    from hp_recompute.runner.memory import DeviceAllocatorPeak, peak_meter

    dev = torch.device("cuda")
    bs = blocks(2, 512, dev)
    x = torch.randn(256, 512, device=dev, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        h = x
        for b in bs:
            h = hr.checkpoint(b, h)
        loss = h.pow(2).mean()
    side = torch.cuda.Stream()
    scope = hr.SessionScope("cuda peak")
    # A first prefetch on the side stream allocates what stays (cuBLAS workspaces): not the session's.
    for handle in handles:
        scope.recompute_handle(handle, "warm-up", stream=side)
    scope.clear_recompute_session("warm-up")
    torch.cuda.synchronize()
    meter = peak_meter(dev)
    assert isinstance(meter, DeviceAllocatorPeak)
    base = torch.cuda.memory_allocated(dev)
    with meter:
        for handle in handles:
            scope.recompute_handle(handle, "s0", stream=side)
    stats = scope.session_stats("s0")
    assert stats["retained_tensors"] > 0
    # what the prefetch left allocated is the session's (less the inputs it aliases, x and h)
    assert 0 < meter.net <= stats["retained_bytes"]
    assert meter.peak >= meter.net
    scope.clear_recompute_session("s0")
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(dev) == base, "the clear left replayed memory allocated"
    del loss
