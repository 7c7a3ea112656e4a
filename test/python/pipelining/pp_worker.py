"""One rank of a PlannedSchedule-versus-torch comparison (spawned by test_planned_schedule.py).

Each rank builds the same model from one seed, keeps the stages the plan puts on it
(torchtitan style: a copy of the whole model with the other stages' layers deleted, so
FQNs are the full model's), and runs one step twice on copies of those stages:

* reference: torch's own schedule class, the plan's checkpointed regions wrapped with
  torch's ``checkpoint_wrapper`` (``torch.utils.checkpoint``, non-reentrant);
* planned: ``hp_recompute.pipelining.PlannedSchedule`` with the plan, on plain blocks or on
  blocks the user wrapped with ``hp_recompute.checkpoint_wrapper`` (``planned_wrap``).

It writes losses, gradients and per-block forward calls of both runs to ``out/rank{R}.pt``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections import Counter
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn

CALLS: Counter = Counter()  # block FQN -> forward calls (forwards and replays)


def _count_call(block: nn.Module) -> None:
    CALLS[block.name] += 1


if hasattr(torch, "compiler"):  # a compiled block counts eagerly, and is not recompiled for each block's name
    _count_call = torch.compiler.disable(_count_call)


class Block(nn.Module):
    def __init__(self, dim: int, name: str, dropout: float) -> None:
        super().__init__()
        self.name = name
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _count_call(self)
        return x + self.fc2(self.drop(torch.tanh(self.fc1(x))))


class Net(nn.Module):
    """``layers.0 .. layers.{n-1}`` then ``head``; a stage keeps a subset (the rest deleted)."""

    def __init__(self, dim: int, n: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): Block(dim, f"layers.{i}", dropout) for i in range(n)})
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return self.head(x) if self.head is not None else x


def stage_module(full: Net, regions: List[str]) -> Net:
    module = copy.deepcopy(full)
    for name in list(module.layers.keys()):
        if f"layers.{name}" not in regions:
            del module.layers[name]
    if "head" not in regions:
        module.head = None
    return module


def torch_schedule(name: str):
    from torch.distributed.pipelining import schedules as S

    return {"zbv": S.ScheduleZBVZeroBubble, "izb": S.ScheduleInterleavedZeroBubble, "1f1b": S.Schedule1F1B,
            "dpv": getattr(S, "ScheduleDualPipeV", None), "i1f1b": S.ScheduleInterleaved1F1B}[name]


def run_one(cls: Any, stages: List[Any], cfg: Dict[str, Any], x: torch.Tensor, y: torch.Tensor, **kw: Any):
    from torch.distributed.pipelining import PipelineStage  # noqa: F401

    loss_fn = kw.pop("loss_fn", lambda out, target: ((out - target) ** 2).mean())
    csv_path = kw.pop("load_csv", None)
    if cls.__name__ == "Schedule1F1B" or cls.__name__ == "ScheduleGPipe":
        schedule = cls(stages[0], cfg["microbatches"], loss_fn=loss_fn, **kw)
    else:
        schedule = cls(stages, cfg["microbatches"], loss_fn=loss_fn, **kw)
    if csv_path is not None:  # torch's own loader and runtime on our --emit torch-csv
        schedule._load_csv(csv_path, format="compute_comms")
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    args = (x,) if first else ()
    from hp_recompute import reset_stats, stats

    # The first step also infers the stages' metadata (extra forwards); the second is measured.
    replays: List[int] = []  # hp_recompute's replays in each step (torch's checkpoint counts none)
    for _ in range(2):
        for st in stages:
            st.submod.zero_grad(set_to_none=True)
        losses: List[torch.Tensor] = []
        CALLS.clear()
        reset_stats()
        torch.manual_seed(1234 + dist.get_rank())
        schedule.step(*args, target=y if last else None, losses=losses if last else None)
        replays.append(stats()["replays"])
    return schedule, [l.detach() for l in losses], dict(CALLS), replays


MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def _label(event: Any) -> str:
    """The innermost hp_recompute label around a profiler event (hpr.exec.profiler-labels)."""
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith("hp_recompute::"):
        parent = parent.cpu_parent
    return "" if parent is None else parent.name


def action_flops(prof: Any) -> Dict[str, int]:
    """Matmul FLOPs by action kind and stage ("backward_input stage 3"): replays apart from
    the action they run in."""
    out: Dict[str, int] = {}
    for e in prof.function_events:
        if e.name in MATMULS:
            label = _label(e)
            words = label.split("::")[-1].split(" ")
            kind = " ".join(words[:3]) if words[0].startswith("backward_") else words[0] or "other"
            out[kind] = out.get(kind, 0) + e.flops
    return out


def profiled_step(schedule: Any, stages: List[Any], x: torch.Tensor, y: torch.Tensor) -> Dict[str, int]:
    """One more step of ``schedule`` under torch's profiler: ``action_flops`` of it."""
    for st in stages:
        st.submod.zero_grad(set_to_none=True)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    with torch.autograd.profiler.profile(use_kineto=True, record_shapes=True, with_flops=True) as prof:
        schedule.step(*((x,) if first else ()), target=y if last else None, losses=[] if last else None)
    return action_flops(prof)


def replay_matmuls(schedule: Any, stages: List[Any], x: torch.Tensor, y: torch.Tensor) -> int:
    """The matmuls (aten mm / addmm) the replays of one more step of ``schedule`` run.

    Counted by a dispatch mode entered around the step, so below any mode a replay
    enters: a selective policy's recompute mode answers a saved op from its cache without
    dispatching it further (torch's profiler would still record the call). A block compiled
    with aot_eager dispatches its ops through it too.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    from hp_recompute.frame import THREAD

    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)

    class Count(TorchDispatchMode):
        n = 0

        @classmethod
        def ignore_compile_internals(cls) -> bool:  # compiled blocks stay compiled, their ops counted at run time
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if func in matmuls and THREAD.replay is not None:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    for st in stages:
        st.submod.zero_grad(set_to_none=True)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    with Count():
        schedule.step(*((x,) if first else ()), target=y if last else None, losses=[] if last else None)
    return Count.n


def held_buffers(stages: List[Any]) -> List[str]:
    """The receive buffers and handed-over tensors ``stages`` hold (hpr.stages.step-buffers:
    none between steps)."""
    return [f"stage {st.stage_index} mb {mb} {info.input_name}" for st in stages
            for infos in (st.args_recv_info, st.grad_recv_info) for mb, recv in infos.items() for info in recv
            if info.buffer is not None]


def stale_reads(stages: List[Any]) -> List[str]:
    """What reading microbatch 0's input of each stage past the first raises between steps
    (hpr.stages.step-buffers: a dropped buffer is an error, never the last step's data); "read" if nothing."""
    out = []
    for st in stages:
        if not st.is_first:
            try:
                st._retrieve_recv_activations(0)
                out.append("read")
            except Exception as e:  # noqa: BLE001 - the error is the result
                out.append(type(e).__name__)
    return out


def reference_then_plan(rank: int, cfg: Dict[str, Any], stages: List[Any], x: torch.Tensor, y: torch.Tensor,
                        **kw: Any):
    """torch's own schedule (``cfg["torch_schedule"]``) on the reference ``stages``; its order dumped
    for the planner (``cfg["dump_csv"]``) and the plan made (``cfg["plan_cmd"]``) by rank 0.
    Returns the reference's losses and block calls."""
    import subprocess

    ref, losses, calls, _ = run_one(torch_schedule(cfg["torch_schedule"]), stages, cfg, x, y, **kw)
    if rank == 0 and cfg.get("dump_csv"):
        ref._dump_csv(cfg["dump_csv"], format="compute_only")  # torch's own order, for the planner
    dist.barrier()
    if rank == 0:
        done = subprocess.run(cfg["plan_cmd"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"planner failed: {done.stderr}")
    dist.barrier()
    return losses, calls


def stage_split(cfg: Dict[str, Any]) -> Dict[int, List[str]]:
    """Stage -> its regions: consecutive layers, the head on the last stage (as the plan's --stages)."""
    per = cfg["layers"] // cfg["stages"]
    split = {s: [f"layers.{i}" for i in range(s * per, (s + 1) * per)] for s in range(cfg["stages"])}
    split[cfg["stages"] - 1].append("head")
    return split


def stages_of_rank(cfg: Dict[str, Any], rank: int) -> List[int]:
    """torch's placement: V (ZBV, DualPipeV) or looped (interleaved), one stage per rank otherwise."""
    ranks, stages = cfg["ranks"], cfg["stages"]
    if stages == ranks:
        return [rank]
    if cfg["torch_schedule"] in ("zbv", "dpv", "dualpipev"):
        return [rank, 2 * ranks - 1 - rank]
    return list(range(rank, stages, ranks))


def planned_wrapper(kind: Any) -> Any:
    """How the planned run's blocks come: None (plain modules), or wrapped by the user with
    ``hp_recompute.checkpoint_wrapper``, ``"full"`` or ``"selective"`` (torch's selective
    checkpoint policy as ``context_fn``: matmul outputs saved, the rest replayed), or
    ``"compiled"``: each block's layers compiled in place with
    ``hp_recompute.compile_backend("aot_eager")`` (their backwards split into I and W
    graphs), then the block wrapped (its forward stays eager: ``CALLS`` counts it)."""
    if kind is None:
        return None
    import functools

    from hp_recompute import checkpoint_wrapper as ours
    from hp_recompute import compile_backend

    if kind == "full":
        return ours
    if kind == "compiled":
        def compiled(block: nn.Module) -> nn.Module:
            for layer in (block.fc1, block.fc2):
                layer.compile(backend=compile_backend("aot_eager"))
            return ours(block)
        return compiled
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    saved = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]
    return functools.partial(ours, context_fn=functools.partial(create_selective_checkpoint_contexts, saved))


def main(rank: int, cfg: Dict[str, Any]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.pipelining import PipelineStage

    sys.path.insert(0, cfg["python"])
    from hp_recompute.pipelining import PlannedSchedule

    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank, world_size=cfg["ranks"])
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        full = Net(cfg["dim"], cfg["layers"], cfg["dropout"])
        split, mine = stage_split(cfg), stages_of_rank(cfg, rank)
        ckpt = {s: [f for f in split[s] if f.startswith("layers.")] for s in mine}
        g = torch.Generator().manual_seed(7)
        x = torch.randn(cfg["batch"], cfg["dim"], generator=g)
        y = torch.randn(cfg["batch"], cfg["dim"], generator=g)

        def make_stages(wrap: Any) -> List[Any]:
            """``wrap``: torch's ``checkpoint_wrapper``, ours, or None (PlannedSchedule patches the regions)."""
            out = []
            for s in mine:
                module = stage_module(full, split[s])
                if wrap is not None:
                    for fqn in ckpt[s]:
                        module.layers[fqn.split(".")[1]] = wrap(module.get_submodule(fqn))
                out.append(PipelineStage(module, s, cfg["stages"], torch.device("cpu")))
            return out

        def grads(stages: List[Any]) -> Dict[str, torch.Tensor]:
            out = {}
            for st in stages:
                for name, p in st.submod.named_parameters():
                    out[name.replace("_checkpoint_wrapped_module.", "")] = p.grad.detach().clone()
            return out

        ref_stages = make_stages(checkpoint_wrapper)
        ref_losses, ref_calls = reference_then_plan(rank, cfg, ref_stages, x, y)
        plan_stages = make_stages(planned_wrapper(cfg.get("planned_wrap")))
        planned, plan_losses, plan_calls, plan_replays = run_one(PlannedSchedule, plan_stages, cfg, x, y,
                                                                 plan=cfg["plan"])
        plan_grads = grads(plan_stages)
        extra: Dict[str, Any] = {}
        # what the replays compute (a selective policy: no matmul)
        if cfg.get("planned_wrap") in ("full", "selective") or cfg.get("count_replay_matmuls"):
            extra["replay_matmuls"] = replay_matmuls(planned, plan_stages, x, y)
        if cfg.get("eval"):  # torchtitan's validation: eval() under no_grad, then with grad enabled
            for mode, context in (("no_grad", torch.no_grad()), ("grad", contextlib.nullcontext())):
                losses: List[torch.Tensor] = []
                with context:
                    planned.eval(x, target=y, losses=losses)
                extra[f"eval_{mode}_losses"] = losses
            extra["grads_after_eval"] = grads(plan_stages)
        if cfg["plan"].endswith(".csv"):
            from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

            rt_stages = make_stages(checkpoint_wrapper)
            rt, rt_losses, _, _ = run_one(_PipelineScheduleRuntime, rt_stages, cfg, x, y, load_csv=cfg["plan"])
            extra = {"rt_losses": rt_losses, "rt_grads": grads(rt_stages),
                     "rt_row": [str(a) for a in rt.pipeline_order_with_comms[rank]]}
        torch.save({**extra, "ref_losses": ref_losses, "plan_losses": plan_losses, "ref_grads": grads(ref_stages),
                    "plan_grads": plan_grads, "ref_calls": ref_calls, "plan_calls": plan_calls,
                    "plan_replays": plan_replays, "held_buffers": held_buffers(plan_stages),
                    "stale_reads": stale_reads(plan_stages),
                    "checkpointed": sorted(f for s in mine for f in ckpt[s])},
                   os.path.join(cfg["out"], f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def refusals(rank: int, cfg: Dict[str, Any]) -> None:
    """hpr.stages.construction-checks: stages that do not match the plan are refused, on every rank."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.pipelining import PipelineStage

    sys.path.insert(0, cfg["python"])
    from hp_recompute.pipelining import PlannedSchedule

    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank, world_size=cfg["ranks"])
    messages: Dict[str, str] = {}
    try:
        torch.manual_seed(0)
        full = Net(cfg["dim"], cfg["layers"], 0.0)
        split, mine = stage_split(cfg), stages_of_rank(cfg, rank)
        loss_fn = lambda out, target: ((out - target) ** 2).mean()  # noqa: E731

        def attempt(name: str, stages: List[Any], n_mb: int, plan: str = cfg["plan"]) -> None:
            try:
                PlannedSchedule(stages, n_mb, loss_fn=loss_fn, plan=plan)
                messages[name] = "accepted"
            except Exception as e:  # noqa: BLE001 - the message is the result
                messages[name] = f"{type(e).__name__}: {e}"

        def stages(modules: Dict[int, Any], **kwargs: Any) -> List[Any]:
            return [PipelineStage(modules[s], s, cfg["stages"], torch.device("cpu"), **kwargs) for s in mine]

        attempt("good", stages({s: stage_module(full, split[s]) for s in mine}), cfg["microbatches"])
        attempt("microbatches", stages({s: stage_module(full, split[s]) for s in mine}), cfg["microbatches"] + 1)
        missing = {s: stage_module(full, split[s]) for s in mine}
        first = split[mine[0]][0].split(".")[1]
        del missing[mine[0]].layers[first]
        attempt("missing region", stages(missing), cfg["microbatches"])
        wrapped = {s: stage_module(full, split[s]) for s in mine}
        wrapped[mine[0]].layers[first] = checkpoint_wrapper(wrapped[mine[0]].layers[first])
        attempt("torch-wrapped region", stages(wrapped), cfg["microbatches"])
        if hasattr(torch, "compile"):  # compiled around the plan's checkpoint: no handle there
            around = {s: stage_module(full, split[s]) for s in mine}
            around[mine[0]].layers[first] = torch.compile(around[mine[0]].layers[first], backend="aot_eager")
            attempt("torch.compile(region)", stages(around), cfg["microbatches"])
            in_place = {s: stage_module(full, split[s]) for s in mine}
            in_place[mine[0]].layers[first].compile(backend="aot_eager")
            attempt("region.compile()", stages(in_place), cfg["microbatches"])
        attempt("dw_builder", stages({s: stage_module(full, split[s]) for s in mine},
                                     dw_builder=lambda: (lambda: None)), cfg["microbatches"])
        extra = {s: stage_module(full, split[s]) for s in mine}
        if rank == 1:  # a block the plan does not place, on one rank only: both must refuse
            extra[mine[0]].layers["99"] = Block(cfg["dim"], "layers.99", 0.0)
        attempt("unplanned block on rank 1", stages(extra), cfg["microbatches"])
        attempt("stages of another rank", [PipelineStage(stage_module(full, split[s]), s, cfg["stages"],
                                                         torch.device("cpu"))
                                           for s in stages_of_rank(cfg, 1 - rank)], cfg["microbatches"])
        for name in ("good_csv", "bad_csv"):  # the torch CSV of the plan, and one with REDUCE_GRAD too early
            attempt(name, stages({s: stage_module(full, split[s]) for s in mine}), cfg["microbatches"], cfg[name])
        torch.save(messages, os.path.join(cfg["out"], f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
