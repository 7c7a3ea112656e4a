"""One rank of PP x FSDP2 under PlannedSchedule (spawned by test_fsdp_stages.py).

The ranks form a (pp, dp) mesh. Each builds the same model from one seed and keeps the
stages the plan puts on its pp rank, wrapped as torchtitan does: each block
``hp_recompute.checkpoint_wrapper``-ed, then ``fully_shard``-ed over the dp dimension,
then the stage module (the root); HSDP when the case asks for a (replicate, shard) dp
mesh. Every dp rank trains on its own batch. The reference is the unsharded model in
this process: the mean over the dp ranks and microbatches of the gradient of each
microbatch's loss (FSDP averages over dp; the schedule scales by the microbatch count).
Cases may add torchtitan's selective policy to the wrapper and run the forwards under
bfloat16 autocast (the reference too; fsdp_worker.py's policy and autocast), and compile
each wrapped block (``compile()`` between the wrapper and ``fully_shard``, torchtitan's
order), counting the halves of the split compiled backwards that ran. Two steps
run (accumulating their gradients when the case asks for gradient accumulation); the
second is compared, with per-block forward calls, replays, live sessions,
the collectives FSDP issued and whether every parameter is sharded again at the end of
the step. A case may also run torch's interleaved 1F1B (1F1B on one stage per rank) with
torch's checkpoint on the same model, for its collectives (``baseline``), on the case's
whole stack (the policy, ``compile()``, autocast and accumulation) for its gradients.
"""

from __future__ import annotations

import copy
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from fsdp_worker import _autocast, _selective, counted_collectives, finish
from pp_worker import CALLS, Net, held_buffers, stage_module, stage_split, stages_of_rank, torch_schedule


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _batch(cfg: Dict[str, Any], dp_rank: int) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(7 + dp_rank)
    return [torch.randn(cfg["batch"], cfg["dim"], generator=g) for _ in range(2)]


def _microbatches(cfg: Dict[str, Any], dp_rank: int) -> List[Any]:
    x, y = _batch(cfg, dp_rank)
    return list(zip(x.chunk(cfg["microbatches"]), y.chunk(cfg["microbatches"])))


def _freeze_first_stage(module: Net, cfg: Dict[str, Any]) -> None:
    """With ``cfg["frozen"]``: the first stage's parameters do not require grad."""
    first = tuple(f"{fqn}." for fqn in stage_split(cfg)[0]) if cfg.get("frozen") else ()
    for name, p in module.named_parameters():
        if name.startswith(first):
            p.requires_grad_(False)


def _reference(full: Net, cfg: Dict[str, Any]) -> Dict[str, Any]:
    ref = copy.deepcopy(full)
    _freeze_first_stage(ref, cfg)
    # accumulating (torchtitan's way: scale_grads=False, the microbatches' gradients summed), two steps
    steps, scale = (2, 1) if cfg.get("accumulate") else (1, cfg["microbatches"])
    for d in [d for _ in range(steps) for d in range(cfg["dp"])]:
        for x, y in _microbatches(cfg, d):
            with _autocast(cfg):
                loss = _loss(ref(x), y)
            (loss / (cfg["dp"] * scale)).backward()
    return {n: p.grad.clone() for n, p in ref.named_parameters() if p.requires_grad}


def _reference_input_grad(full: Net, cfg: Dict[str, Any], dp_rank: int) -> torch.Tensor:
    """The gradient of this dp rank's step input: the sum over its microbatches' losses (torch's
    schedules scale parameter gradients by the microbatch count, not input gradients)."""
    ref = copy.deepcopy(full)
    x, y = _batch(cfg, dp_rank)
    x.requires_grad_(True)
    for a, b in zip(x.chunk(cfg["microbatches"]), y.chunk(cfg["microbatches"])):
        with _autocast(cfg):
            loss = _loss(ref(a), b)
        loss.backward()
    return x.grad.clone()


def _wrap(module: Net, cfg: Dict[str, Any], dp_mesh: Any) -> Net:
    import hp_recompute as hr
    from torch.distributed.fsdp import fully_shard

    options = {"context_fn": _selective()} if cfg.get("selective") else {}
    for key in list(module.layers.keys()):
        if not cfg.get("unwrapped"):  # else PlannedSchedule checkpoints the sharded blocks itself
            module.layers[key] = hr.checkpoint_wrapper(module.layers[key], **options)
            if cfg.get("compile"):
                module.layers[key].compile(backend=cfg["compile"])
        fully_shard(module.layers[key], mesh=dp_mesh, reshard_after_forward=cfg["reshard"])
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=cfg["reshard"])
    return module


def run(rank: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.tensor import DTensor

    import hp_recompute as hr
    from hp_recompute.pipelining import PlannedSchedule

    pp, dp = cfg["pp"], cfg["dp"]
    if cfg.get("hsdp"):
        mesh = init_device_mesh("cpu", (pp, 2, dp // 2), mesh_dim_names=("pp", "replicate", "shard"))
        dp_mesh = mesh["replicate", "shard"]
    else:
        mesh = init_device_mesh("cpu", (pp, dp), mesh_dim_names=("pp", "dp"))
        dp_mesh = mesh["dp"]
    pp_rank = mesh.get_local_rank("pp")
    dp_rank = _dp_index(dp_mesh)
    torch.manual_seed(0)
    full = Net(cfg["dim"], cfg["layers"], 0.0)
    res: Dict[str, Any] = {"ref_grads": _reference(full, cfg)}
    _freeze_first_stage(full, cfg)
    x, y = _batch(cfg, dp_rank)
    if cfg.get("input_grad"):
        res["ref_input_grad"] = _reference_input_grad(full, cfg, dp_rank)
        x.requires_grad_(True)
    with torch.no_grad(), _autocast(cfg):
        res["ref_losses"] = [_loss(full(a), b) for a, b in _microbatches(cfg, dp_rank)]

    split = stage_split(cfg)
    mine = stages_of_rank({**cfg, "ranks": pp}, pp_rank)
    stages = [PipelineStage(_wrap(stage_module(full, split[s]), cfg, dp_mesh), s, cfg["stages"],
                            torch.device("cpu"), group=mesh.get_group("pp")) for s in mine]
    schedule = PlannedSchedule(stages, cfg["microbatches"], loss_fn=_loss, plan=cfg["plan"],
                               scale_grads=not cfg.get("accumulate"))
    plan_calls = _count_plan_calls()
    halves = _count_compiled_halves() if cfg.get("compile") else {}
    res["fsdp_split"] = sorted(schedule.own_split)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    replays = []
    for n in range(2):
        plan_calls.clear()
        halves.clear()
        for st in stages:
            if n == 0 or not cfg.get("accumulate"):
                st.submod.zero_grad(set_to_none=True)
        x.grad = None
        losses: List[torch.Tensor] = []
        CALLS.clear()
        hr.reset_stats()
        with _autocast(cfg), counted_collectives() as collectives:
            schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses if last else None)
        replays.append(hr.stats()["replays"])
    res["collectives"] = dict(collectives)  # the second step's
    res["losses"] = [l.detach() for l in losses]
    if cfg.get("input_grad") and first:
        res["input_grad"] = None if x.grad is None else x.grad.clone()
    res["replays"], res["calls"] = replays, dict(CALLS)
    res["checkpointed"] = sorted(f for s in mine for f in split[s] if f.startswith("layers."))
    res["grads"] = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.full_tensor().clone()
                    for st in stages for n, p in st.submod.named_parameters() if p.requires_grad}
    res["sharded_at_end"] = all(isinstance(p, DTensor) for st in stages for p in st.submod.parameters())
    res["live_sessions"] = len(schedule.session_scope.live_sessions())
    res["plan_calls"], res["pp_rank"] = dict(plan_calls), pp_rank
    res["compiled_halves"] = dict(halves)
    res["fsdp_modules"] = {st.stage_index: sum(hr.fsdp.is_fsdp_module(m) for m in st.submod.modules())
                           for st in stages}
    res["sharding_modules"] = sum(_manages_parameters(m) for st in stages for m in st.submod.modules())
    if cfg.get("baseline"):
        res["baseline"] = _torch_baseline(full, cfg, mesh, dp_mesh, pp_rank, x, y, res["ref_grads"])
    if cfg.get("eval"):  # torchtitan's validation on the same stages: the plan's forwards alone
        before = {n: p.grad.full_tensor().clone() for st in stages for n, p in st.submod.named_parameters()}
        eval_losses: List[torch.Tensor] = []
        with torch.no_grad(), _autocast(cfg):
            schedule.eval(*((x,) if first else ()), target=y if last else None, losses=eval_losses if last else None)
        res["eval_losses"] = [l.detach() for l in eval_losses]
        res["grads_changed_by_eval"] = [n for st in stages for n, p in st.submod.named_parameters()
                                        if not torch.equal(p.grad.full_tensor(), before[n])]
        res["sharded_after_eval"] = all(isinstance(p, DTensor) for st in stages for p in st.submod.parameters())
    res["held_buffers"] = held_buffers(stages)
    return res


def _torch_baseline(full: Net, cfg: Dict[str, Any], mesh: Any, dp_mesh: Any, pp_rank: int, x: torch.Tensor,
                    y: torch.Tensor, ref_grads: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """torch's strongest correct schedule on the same model and stages: interleaved 1F1B (1F1B with
    one stage per rank), each block in torch's ``checkpoint_wrapper`` (with the case's policy,
    then ``compile()``-d where the case compiles) then ``fully_shard``-ed, the stages placed in
    loops; its second step's collectives, its gradients, and whether they are exact."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage

    looped = {**cfg, "ranks": cfg["pp"], "torch_schedule": "i1f1b"}
    split = stage_split(cfg)
    stages = []
    for s in stages_of_rank(looped, pp_rank):
        module = stage_module(full, split[s])
        for key in list(module.layers.keys()):
            module.layers[key] = checkpoint_wrapper(module.layers[key],
                                                    **({"context_fn": _selective()} if cfg.get("selective") else {}))
            if cfg.get("compile"):  # torch's own wrapper compiles around its checkpoint
                module.layers[key].compile(backend=cfg["compile"])
            fully_shard(module.layers[key], mesh=dp_mesh, reshard_after_forward=cfg["reshard"])
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=cfg["reshard"])
        stages.append(PipelineStage(module, s, cfg["stages"], torch.device("cpu"), group=mesh.get_group("pp")))
    cls = torch_schedule("i1f1b" if cfg["stages"] > cfg["pp"] else "1f1b")
    schedule = cls(stages if cfg["stages"] > cfg["pp"] else stages[0], cfg["microbatches"], loss_fn=_loss,
                   scale_grads=not cfg.get("accumulate"))
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    x = x.detach()
    for n in range(2):
        for st in stages:
            if n == 0 or not cfg.get("accumulate"):
                st.submod.zero_grad(set_to_none=True)
        with _autocast(cfg), counted_collectives() as collectives:
            schedule.step(*((x,) if first else ()), target=y if last else None)
    grads = {n.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", ""): p.grad.full_tensor().clone()
             for st in stages for n, p in st.submod.named_parameters() if p.requires_grad}
    exact = all(torch.allclose(g, ref_grads[n], rtol=1e-5, atol=1e-7) for n, g in grads.items())
    return {"schedule": cls.__name__, "collectives": dict(collectives), "exact": exact, "grads": grads}


def _manages_parameters(module: Any) -> bool:
    """Whether ``module`` is an FSDP module with parameters of its own (not a nested FSDP module's):
    one that all-gathers and reduce-scatters."""
    import hp_recompute as hr

    if not hr.fsdp.is_fsdp_module(module):
        return False
    nested = {id(p) for m in module.modules() if m is not module and hr.fsdp.is_fsdp_module(m)
              for p in m.parameters()}
    return any(id(p) not in nested for p in module.parameters())


def _count_plan_calls() -> Dict[str, int]:
    """Counts FSDPModule.unshard / reshard called by PlannedSchedule's own code (its plan's
    unshard and reshard actions), not by FSDP's hooks or the replay's gathering."""
    from torch.distributed.fsdp import FSDPModule

    counts: Dict[str, int] = {}
    for name in ("unshard", "reshard"):
        original = getattr(FSDPModule, name)

        def counted(self: Any, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            if sys._getframe(1).f_globals.get("__name__") == "hp_recompute.pipelining.schedule":
                counts[_name] = counts.get(_name, 0) + 1
            return _original(self, *args, **kwargs)

        setattr(FSDPModule, name, counted)
    return counts


def _count_compiled_halves() -> Dict[str, int]:
    """Counts the compiled backwards of ``compile_backend`` blocks by what each ran
    (hpr.compiled-split.phase): ``"input"`` (I's half), ``"weight"`` (W's half) or ``"whole"``."""
    from hp_recompute import compile_split

    counts: Dict[str, int] = {}
    original = compile_split._SplitBackward.__call__

    def counted(self: Any, args: List[Any]) -> List[Any]:
        phase, stash, node = compile_split._phase_of_running_node()
        split = phase == "input" and self.part.w_pos or phase == "weight" and node in stash
        kind = phase if split else "whole"
        counts[kind] = counts.get(kind, 0) + 1
        return original(self, args)

    compile_split._SplitBackward.__call__ = counted
    return counts


def _dp_index(dp_mesh: Any) -> int:
    """This rank's index in the flattened dp mesh (its data shard)."""
    coords = dp_mesh.get_coordinate()
    index = 0
    for size, c in zip(dp_mesh.shape, coords):
        index = index * size + c
    return index


def main(rank: int, cfg: Dict[str, Any]) -> None:
    sys.path.insert(0, cfg["python"])
    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank, world_size=cfg["pp"] * cfg["dp"])
    torch.set_num_threads(1)
    try:
        res = run(rank, cfg)
    except BaseException:  # noqa: BLE001 -- reported to the test
        res = {"exception": traceback.format_exc()}
    finish(res, Path(cfg["out"]) / f"rank{rank}.pt")
