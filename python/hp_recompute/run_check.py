"""The reference step and the gradient comparison behind the report's ``grads_match``.

Why: a pipelined, checkpointed step is only correct if it computes what the plain model
computes. The reference runs the whole model (``PipelineModel.reference_loss``, i.e. the
module's own ``forward``) per microbatch with no pipeline and no checkpoint, takes each
microbatch's parameter gradients with ``autograd.grad``, and sums them per parameter in
the order the plan produces that stage's weight gradients (``Plan.weight_grad_order``),
so that single-process runs can be compared bit for bit.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

import torch

from .run_model import PipelineModel, StageSpec

__all__ = ["make_batches", "reference_step", "compare", "sgd_update", "sum_losses", "LR"]

#: Learning rate of the plain SGD update between steps (``--steps K > 1``).
LR = 0.05


def make_batches(model: PipelineModel, seed: int, step: int, num_mb: int) -> List[Any]:
    """Deterministic microbatches of one step: the same on every rank and in the reference."""
    out = []
    for mb in range(num_mb):
        g = torch.Generator().manual_seed(seed * 1_000_003 + step * 10_007 + mb)
        out.append(model.make_batch(g))
    return out


def sum_losses(losses: Dict[int, torch.Tensor]) -> torch.Tensor:
    """The step loss: the scaled microbatch losses summed in microbatch order."""
    total = None
    for mb in sorted(losses):
        total = losses[mb] if total is None else total + losses[mb]
    assert total is not None
    return total


def reference_step(model: PipelineModel, batches: Sequence[Any], specs: Sequence[StageSpec],
                   order: Dict[int, List[int]]) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Plain step: per-microbatch loss / M and its gradients, summed in the plan's order.

    Returns:
        (gradient per parameter name, step loss).
    """
    names = [n for n, p in model.module.named_parameters() if p.requires_grad]
    params = dict(model.module.named_parameters())
    num_mb = len(batches)
    per_mb: Dict[int, Dict[str, torch.Tensor]] = {}
    losses: Dict[int, torch.Tensor] = {}
    for mb, batch in enumerate(batches):
        loss = model.reference_loss(batch) / num_mb
        grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        per_mb[mb] = {n: g for n, g in zip(names, grads) if g is not None}
        losses[mb] = loss.detach()
    owner = {n: s.stage for s in specs for n in s.params}
    out: Dict[str, torch.Tensor] = {}
    for name in names:
        acc = None
        for mb in order[owner[name]]:
            g = per_mb[mb].get(name)
            if g is None:
                continue
            acc = g if acc is None else acc.add_(g)
        if acc is not None:
            out[name] = acc
    return out, sum_losses(losses)


def compare(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], got_loss: torch.Tensor,
            want_loss: torch.Tensor, exact: bool, rtol: float = 1e-5, atol: float = 1e-6) -> Dict[str, Any]:
    """Compares gradients and loss; ``exact`` means ``torch.equal``, else ``allclose``.

    Returns:
        ``{"grads_match", "max_abs_diff", "mismatched"}`` (at most 5 mismatched names).
    """
    mismatched: List[str] = []
    worst = 0.0
    for name in sorted(set(got) | set(want)):
        a, b = got.get(name), want.get(name)
        if a is None or b is None or a.shape != b.shape:
            mismatched.append(f"{name} (missing or shape)")
            worst = math.inf
            continue
        diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        worst = max(worst, diff)
        same = torch.equal(a, b) if exact else torch.allclose(a, b, rtol=rtol, atol=atol)
        if not same:
            mismatched.append(f"{name} (max abs diff {diff:.3g})")
    loss_diff = abs(got_loss.double().item() - want_loss.double().item())
    worst = max(worst, loss_diff)
    loss_same = torch.equal(got_loss, want_loss) if exact else torch.allclose(got_loss, want_loss, rtol, atol)
    if not loss_same:
        mismatched.append(f"loss (abs diff {loss_diff:.3g})")
    return {"grads_match": not mismatched, "max_abs_diff": worst, "mismatched": mismatched[:5]}


@torch.no_grad()
def sgd_update(module: torch.nn.Module, grads: Dict[str, torch.Tensor], names: Sequence[str]) -> None:
    """``p -= LR * grad`` for ``names`` (the same op in the runner and the reference)."""
    params = dict(module.named_parameters())
    for name in names:
        if name in grads:
            params[name].sub_(grads[name] * LR)
