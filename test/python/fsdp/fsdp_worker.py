"""One gloo rank of the FSDP2 / HSDP split tests (spawned by test_fsdp_split.py).

Every rank builds the same tiny model (two checkpointed blocks and a head), wraps it
the way torchtitan does (``checkpoint_wrapper`` per block -- optionally with a selective
policy --, ``fully_shard`` per block, optionally ``block.compile()``, then the root; HSDP
on a (replicate, shard) mesh; forwards optionally under bfloat16 autocast), runs one step of ``microbatches``
microbatches split into I and W (optionally with every block prefetched into the
microbatch's session), reduces with ``hp_recompute.fsdp.reduce_gradients``, and saves
what the test compares: the full gradients, the references' gradients, the collectives
FSDP issued in each phase, replay counts and the parameters' shard state after a prefetch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, Iterator, List

import torch

DIM, BATCH = 8, 2


def _data(rank: int, mb: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + mb)
    return torch.randn(BATCH, DIM, generator=g)


class _SkipsLast(torch.nn.Sequential):
    """Runs every child but the last: a parameter the graph never reaches."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for child in list(self)[:-1]:
            x = child(x)
        return x


class _Block(torch.nn.Sequential):
    """Linear, Tanh, Linear with a forward of its own: ``nn.Sequential``'s forward is torch's
    code, whose frame dynamo skips, so its ``compile()`` would compile nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for child in self:
            x = child(x)
        return x


def _model(unused: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [_Block(torch.nn.Linear(DIM, DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, DIM)) for _ in range(2)]
    if unused:
        return _SkipsLast(*blocks, torch.nn.Linear(DIM, DIM), torch.nn.Linear(DIM, DIM))
    return torch.nn.Sequential(*blocks, torch.nn.Linear(DIM, DIM))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).sum()


#: torch.distributed's collectives FSDP2 issues, by kind (the names differ across torch versions)
COLLECTIVES = {"all_gather": ("all_gather_single", "all_gather_into_tensor", "_all_gather_base"),
               "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"),
               "all_reduce": ("all_reduce",)}


class Comms:
    """Counts the collectives issued while installed, per ``phase`` and kind (``COLLECTIVES``):
    each call once, however torch routes it (one of these functions may call another).
    ``restore()`` puts torch.distributed's functions back."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.counts: Dict[str, Dict[str, int]] = {}
        self.phase = "setup"
        self._depth = 0
        self._saved: List[Any] = []
        for kind, names in COLLECTIVES.items():
            for name in names:
                original = getattr(dist, name, None)
                if original is not None:
                    self._saved.append((name, original))
                    setattr(dist, name, self._counted(kind, original))

    def _counted(self, kind: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                bucket = self.counts.setdefault(self.phase, {})
                bucket[kind] = bucket.get(kind, 0) + 1
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1
        return counted

    def restore(self) -> None:
        import torch.distributed as dist

        for name, original in self._saved:
            setattr(dist, name, original)


@contextlib.contextmanager
def counted_collectives() -> Iterator[Dict[str, int]]:
    """The collectives issued inside, by kind (``Comms`` for one phase)."""
    comms = Comms()
    try:
        yield comms.counts.setdefault(comms.phase, {})
    finally:
        comms.restore()


def _selective() -> Any:
    """A selective policy (torch's SAC): the matmuls' outputs saved, the rest replayed."""
    import functools

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    aten = torch.ops.aten
    return functools.partial(create_selective_checkpoint_contexts, [aten.mm.default, aten.addmm.default])


def _wrap(model: torch.nn.Module, cfg: Dict[str, Any], mesh: Any) -> torch.nn.Module:
    """torchtitan's order: checkpoint-wrap, ``fully_shard`` per block, ``block.compile()``, the root."""
    import hp_recompute as hr
    from torch.distributed.fsdp import fully_shard

    options = {"context_fn": _selective()} if cfg.get("selective") else {}
    for i in range(2):
        model[i] = hr.checkpoint_wrapper(model[i], **options)
        fully_shard(model[i], mesh=mesh, reshard_after_forward=cfg["reshard"])
        if cfg.get("compile"):
            model[i].compile(backend=cfg["compile"])
    fully_shard(model, mesh=mesh, reshard_after_forward=cfg["reshard"])
    return model


def _autocast(cfg: Dict[str, Any]) -> Any:
    """bfloat16 autocast on the CPU when the case asks for it (the forwards only, as in training)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(cfg.get("autocast")))


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return all(isinstance(p, DTensor) for p in module.parameters())


def run(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    import hp_recompute as hr

    world, mbs = cfg["ranks"], cfg["microbatches"]
    mesh = None
    if cfg.get("hsdp"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    res: Dict[str, Any] = {}

    # Reference 1: the unsharded model, every rank's data; FSDP averages over the ranks.
    ref = _model()
    for r in range(world):
        for mb in range(mbs):
            with _autocast(cfg):
                loss = _loss(ref(_data(r, mb))) / world
            loss.backward()
    res["ref"] = [p.grad.clone() for p in ref.parameters()]

    # Reference 2: the same FSDP wrapping with plain loss.backward() per microbatch.
    plain = _wrap(_model(), cfg, mesh)
    for mb in range(mbs):
        with _autocast(cfg):
            loss = _loss(plain(_data(rank, mb)))
        loss.backward()
    res["plain"] = [_full(p.grad).clone() for p in plain.parameters()]

    comms = Comms()
    model = _wrap(_model(unused=cfg.get("bad") == "unreached"), cfg, mesh)
    names = [n for n, _ in model.named_parameters()]
    res["names"] = names
    scope = hr.SessionScope(f"rank {rank}")
    losses: List[torch.Tensor] = []
    inputs: List[torch.Tensor] = []
    handles: List[List[Any]] = []
    comms.phase = "forward"
    for mb in range(mbs):
        x = _data(rank, mb).requires_grad_(not cfg.get("no_input"))  # stage 0: no input gradient
        try:
            with hr.recompute_handle_collector_ctx() as hs, _autocast(cfg):
                losses.append(_loss(model(x)))
        except hr.CheckpointError as error:
            if not cfg.get("forward_refused"):
                raise
            res["error"] = str(error)
            return res
        inputs.append(x)
        handles.append(list(hs))
    res["handles"] = [len(h) for h in handles]

    hr.reset_stats()
    states = []
    bad = cfg.get("bad")
    if cfg.get("hold"):  # the caller owns the parameters' lifetime for the step (hpr.fsdp.hold-parameters)
        res["held"] = hr.fsdp.begin_step(model, hold_parameters=True)
    comms.phase = "backward"
    for mb in range(mbs):
        sid = f"s0.mb{mb}"
        if mb == 0 and cfg.get("plain_first"):  # B of microbatch 0 in the split step
            res["began"] = hr.fsdp.begin_step(model)
            losses[0].backward()
            continue
        if cfg.get("prefetch"):
            comms.phase = "prefetch"
            res.setdefault("sharded_before_prefetch", []).append([_sharded(model[i]) for i in range(2)])
            for h in handles[mb]:
                scope.recompute_handle(h, sid)
            res.setdefault("sharded_after_prefetch", []).append([_sharded(model[i]) for i in range(2)])
            comms.phase = "backward"
        with scope.recompute_session_ctx(sid, retain_on_unpack=True):
            want_x = [inputs[mb]] if inputs[mb].requires_grad else []
            dx, state = hr.backward_input([losses[mb]], None, want_x, model)
        states.append((sid, state))
    if cfg.get("hold") == "discard":  # a failed step: its held parameters are resharded, settings restored
        res["discarded"] = hr.fsdp.discard_step(model)
        res["sharded_after_discard"] = [_sharded(model[i]) for i in range(2)]
        scope.clear_all()
        comms.phase = "plain_after"
        with _autocast(cfg):
            _loss(model(_data(rank, 0))).backward()
        res["comms"] = comms.counts
        res["sharded_after_plain"] = [_sharded(model[i]) for i in range(2)]
        return res
    if bad == "unreached":
        try:
            with scope.recompute_session_ctx(states[0][0]):
                hr.backward_weight(states[0][1])
        except hr.CheckpointError as error:
            res["error"] = str(error)
        res["discarded"] = hr.fsdp.discard_step(model)
        scope.clear_all()
        return res
    if bad == "reduce_before_w":
        comms.phase = "reduce"
        try:
            hr.fsdp.reduce_gradients(model)
        except hr.CheckpointError as error:
            res["error"] = str(error)
        res["discarded"] = hr.fsdp.discard_step(model)
        sid, state = states[0]
        try:
            with scope.recompute_session_ctx(sid):
                hr.backward_weight(state)
        except hr.CheckpointError as error:
            res["w_error"] = str(error)
        scope.clear_all()
        res["comms"] = comms.counts
        res["grads"] = [p.grad for p in model.parameters()]
        return res
    for sid, state in states:  # the Ws after every I (zero-bubble order)
        with scope.recompute_session_ctx(sid):
            got = hr.backward_weight(state)
        assert all(g is not None for g in got)
        scope.clear_recompute_session(sid)
    res["replays"] = hr.stats()["replays"]
    res["session_replays"] = hr.stats()["session_replays"]
    res["grads_before_reduce"] = [p.grad is not None for p in model.parameters()]
    comms.phase = "reduce"
    res["reduced"] = hr.fsdp.reduce_gradients(model)
    comms.phase = "after"
    res["reduced_again"] = hr.fsdp.reduce_gradients(model)  # no step open: nothing to do
    res["grads"] = [_full(p.grad).clone() for p in model.parameters()]
    res["sharded_after_step"] = [_sharded(model[i]) for i in range(2)]
    res["comms"] = comms.counts
    res["live_sessions"] = len(scope.live_sessions())
    if cfg.get("compile"):  # the blocks ran compiled graphs (dynamo captured some)
        res["compiled_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    # A second step on the same model: the settings of the first were restored, and a
    # plain backward (FSDP's own sync) adds to the sharded gradients as usual.
    comms.phase = "plain_after"
    _loss(model(_data(rank, 0))).backward()
    res["plain_after"] = [_full(p.grad).clone() for p in model.parameters()]
    return res


def finish(res: Dict[str, Any], path: Path) -> None:
    """Saves this rank's result ``res`` to ``path`` and ends the process. A rank that raised
    (``res["exception"]``) ends at once with exit code 1: its peers may be waiting for it in
    a receive or a collective, where a closing barrier would hang them until gloo's timeout
    (30 minutes); ``rank_processes.spawn_ranks`` stops them and reports the traceback."""
    import torch.distributed as dist

    torch.save(res, path)
    sys.stdout.flush()
    sys.stderr.flush()
    if "exception" in res:
        os._exit(1)
    # Every rank's collectives are done before any tears its connections down: a rank that
    # exits while its peer still talks to it aborts in gloo ("terminate called ...") under load.
    dist.barrier()
    dist.destroy_process_group()
    # The result is on disk; leave without the interpreter's teardown, where a thread torch's
    # distributed stack left joinable still aborted the process now and then under load
    # ("terminate called without an active exception", SIGABRT), failing a finished case.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(rank: int, cfg: Dict[str, Any]) -> None:
    sys.path.insert(0, cfg["python"])
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank, world_size=cfg["ranks"])
    try:
        res = run(rank, cfg)
    except BaseException:  # noqa: BLE001 -- reported to the test
        res = {"exception": traceback.format_exc()}
    finish(res, Path(cfg["out"]) / f"rank{rank}.pt")
