"""One rank of the compiled torchtitan-style model under a zero-bubble plan (spawned by test_planned_schedule.py).

A held-out model written as torchtitan writes its Llama (``layers`` a ModuleDict of
blocks with RMSNorm, rotary embeddings, SDPA and a SwiGLU feed-forward; each stage a copy
of the whole model with the other stages' parts deleted), prepared in torchtitan's order:
each block wrapped with ``hp_recompute.checkpoint_wrapper``, then ``block.compile()``. Each
rank runs, on the same weights and batch:

* reference: torch's schedule class (``cfg["torch_schedule"]``: ZBV, interleaved
  zero-bubble, DualPipeV) on eager blocks wrapped with torch's own ``checkpoint_wrapper``
  (torch's zero-bubble schedules refuse compiled stages);
* torch on compiled stages: the same class built on ``torch.compile(block)`` stages, to
  record what torch says;
* planned: ``PlannedSchedule`` with the plan, on the compiled blocks. Its second step
  is profiled: the matmul FLOPs inside its ``backward_input`` / ``backward_weight``
  actions (replays excluded) against one plain backward of the same compiled stages.

It writes losses, gradients, replays and FLOPs to ``out/rank{R}.pt``.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import pp_worker
from pp_worker import MATMULS

DIM, HEADS, VOCAB, SEQ = 32, 4, 64, 16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, seq: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), inv)
    return torch.stack([angles.cos(), angles.sin()])  # (2, seq, head_dim / 2)


def rotate(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    cos, sin = tables[0][: x.shape[1]], tables[1][: x.shape[1]]
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, HEADS, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, tables), rotate(k, tables)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, DIM))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        hidden = 3 * DIM
        self.w1, self.w2, self.w3 = nn.Linear(DIM, hidden, bias=False), nn.Linear(hidden, DIM, bias=False), \
            nn.Linear(DIM, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention, self.feed_forward = Attention(), FeedForward()
        self.attention_norm, self.ffn_norm = RMSNorm(DIM), RMSNorm(DIM)

    def forward(self, x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), tables)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """torchtitan's layout: a stage keeps the parts it runs, the others are None or deleted."""

    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.tok_embeddings: Optional[nn.Module] = nn.Embedding(VOCAB, DIM)
        self.register_buffer("rope", rope_tables(DIM // HEADS, SEQ), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock() for i in range(n_layers)})
        self.norm: Optional[nn.Module] = RMSNorm(DIM)
        self.output: Optional[nn.Module] = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def stage_module(full: Transformer, stage: int, stages: int) -> Transformer:
    module = copy.deepcopy(full)
    for name in list(module.layers.keys()):
        if int(name) != stage:
            del module.layers[name]
    if stage != 0:
        module.tok_embeddings = None
    if stage != stages - 1:
        module.norm = module.output = None
    return module


def main(rank: int, cfg: Dict[str, Any]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as torch_wrapper
    from torch.distributed.pipelining import PipelineStage

    from hp_recompute import checkpoint_wrapper, reset_stats, selective_context_fn, stats
    from hp_recompute.pipelining import PlannedSchedule

    dist.init_process_group("gloo", init_method=f"file://{cfg['store']}", rank=rank, world_size=cfg["ranks"])
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        stages = cfg["stages"]
        full = Transformer(stages)
        mine = pp_worker.stages_of_rank(cfg, rank)
        g = torch.Generator().manual_seed(7)
        x = torch.randint(0, VOCAB, (cfg["batch"], SEQ), generator=g)
        y = torch.randint(0, VOCAB, (cfg["batch"], SEQ), generator=g)

        def make_stages(prepare: Any) -> List[Any]:
            out = []
            for s in mine:
                module = stage_module(full, s, stages)
                for name in list(module.layers.keys()):
                    module.layers[name] = prepare(module.layers[name])
                out.append(PipelineStage(module, s, stages, torch.device("cpu")))
            return out

        def grads(st: List[Any]) -> Dict[str, torch.Tensor]:
            return {name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", ""): p.grad.detach().clone()
                    for s in st for name, p in s.submod.named_parameters()}

        ref_stages = make_stages(torch_wrapper)
        ref_losses, _ = pp_worker.reference_then_plan(rank, cfg, ref_stages, x, y, loss_fn=loss_fn)

        try:  # what torch's own schedule does with compiled stages (it checks when it is built)
            compiled = make_stages(lambda b: torch.compile(torch_wrapper(b), backend=cfg["backend"]))
            pp_worker.torch_schedule(cfg["torch_schedule"])(compiled, cfg["microbatches"], loss_fn=loss_fn)
            torch_on_compiled = "accepted"
        except Exception as e:  # noqa: BLE001 - the message is the result
            torch_on_compiled = f"{type(e).__name__}: {e}"

        def titan(block: nn.Module) -> nn.Module:  # torchtitan's order: activation checkpointing, then compile
            policy = {"context_fn": selective_context_fn()} if cfg.get("selective") else {}
            wrapped = checkpoint_wrapper(block, **policy)
            wrapped.compile(backend=cfg["backend"], fullgraph=True)
            return wrapped

        plan_stages = make_stages(titan)
        schedule, plan_losses, _, plan_replays = pp_worker.run_one(PlannedSchedule, plan_stages, cfg, x, y,
                                                                   plan=cfg["plan"], loss_fn=loss_fn)
        plan_grads = grads(plan_stages)
        reset_stats()
        flops = pp_worker.profiled_step(schedule, plan_stages, x, y)  # a third step
        plan_replays.append(stats()["replays"])
        replay_matmuls = pp_worker.replay_matmuls(schedule, plan_stages, x, y)  # a fourth step
        one_backward = one_backward_flops(plan_stages, x, y, cfg)
        torch.save({"ref_losses": ref_losses, "plan_losses": plan_losses, "ref_grads": grads(ref_stages),
                    "plan_grads": plan_grads, "plan_replays": plan_replays, "blocks": len(mine),
                    "flops": flops, "replay_matmuls": replay_matmuls, "one_backward": one_backward, "torch_on_compiled": torch_on_compiled},
                   os.path.join(cfg["out"], f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def one_backward_flops(stages: List[Any], x: torch.Tensor, y: torch.Tensor, cfg: Dict[str, Any]) -> int:
    """Matmul FLOPs of one plain backward of each of ``stages`` over the whole batch.

    Each stage runs on a random input of its input's shape (its real input lives on the
    other rank); its output gets a random gradient, the last stage's the loss's. The
    checkpoint's wrapper runs its block plainly (``plain_forwards``), so no replay is
    counted; the compiled backward runs whole (no split phase).
    """
    from hp_recompute.plan.interpreter import plain_forwards

    total = 0
    for st in stages:
        module = st.submod
        for attempt in range(2):  # the first call compiles the backward
            if st.is_first:
                inp = x
            else:
                inp = torch.randn(cfg["batch"], SEQ, DIM, requires_grad=True)
            params = [p for p in module.parameters() if p.requires_grad]
            with plain_forwards():
                out = module(inp)
            seed = loss_fn(out, y) if st.is_last else (out * torch.randn_like(out)).sum()
            wrt = params + ([inp] if inp.requires_grad else [])
            with torch.autograd.profiler.profile(use_kineto=True, record_shapes=True, with_flops=True) as prof:
                torch.autograd.grad(seed, wrt)
            flops = sum(e.flops for e in prof.function_events if e.name in MATMULS)
        total += flops
    return total
