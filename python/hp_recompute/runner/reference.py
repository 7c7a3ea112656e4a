"""The reference step and the comparisons behind the report's ``grads_match``.

Why: a pipelined, checkpointed step is only correct if it computes what the plain model
computes. The reference runs every microbatch of the step through all regions in order
(each from its own RNG stream, ``Unit``), with no pipeline and no checkpoint, takes each
microbatch's parameter gradients with ``autograd.grad``, and sums them per parameter:
first in the order the plan produces that stage's weight gradients
(``Plan.weight_grad_order``, so single-process runs compare bit for bit), then every
microbatch the plan never differentiates. A plan that drops an I, W or B therefore fails.
That the regions compute the module's own ``forward`` is checked once, in eval mode
(``check_regions``). Buffers a forward updates (BatchNorm statistics) are compared too.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

import torch

from .model import PipelineModel, StageSpec, Unit
from ..errors import RunError

__all__ = ["microbatch_seeds", "make_batches", "reference_step", "check_regions", "compare",
           "buffer_snapshot", "updated_buffers", "sgd_update", "sum_losses", "LR"]

#: Learning rate of the plain SGD update between steps (``--steps K > 1``).
LR = 0.05


def microbatch_seeds(seed: int, step: int, num_mb: int) -> List[int]:
    """One seed per microbatch of a step: its data and its regions' RNG streams derive from it."""
    return [seed * 1_000_003 + step * 10_007 + mb for mb in range(num_mb)]


def make_batches(model: PipelineModel, seed: int, step: int, num_mb: int) -> List[Any]:
    """Deterministic microbatches of one step: the same on every rank and in the reference."""
    return [model.make_batch(torch.Generator().manual_seed(s)) for s in microbatch_seeds(seed, step, num_mb)]


def check_regions(model: PipelineModel, batch: Any) -> None:
    """Raises ``RunError`` unless the regions in order compute ``reference_loss`` (eval mode).

    Eval mode switches dropout off and makes BatchNorm read its statistics without
    updating them, so both sides are deterministic and the check leaves no trace.
    """
    training = model.module.training
    model.module.eval()
    try:
        with torch.no_grad():
            x = batch
            for i, region in enumerate(model.regions[:-1]):
                x = Unit(region.name, False, [region])(x, batch)
                if not isinstance(x, torch.Tensor):
                    # Stages pass one tensor; a tuple would be cut apart at a stage boundary.
                    raise RunError(f"hp_recompute.run: model '{model.name}': region '{region.name}' returns "
                                   f"{type(x).__name__}, but every region but the last must return one tensor "
                                   f"(any region may end a stage); return a tensor, or merge the regions")
            chained = Unit(model.regions[-1].name, False, [model.regions[-1]])(x, batch)
            own = model.reference_loss(batch)
    finally:
        model.module.train(training)
    if not torch.allclose(chained, own, rtol=1e-5, atol=1e-6):
        raise RunError(f"hp_recompute.run: model '{model.name}': its regions in order give loss "
                       f"{chained.item():.6g} but reference_loss (the module's forward) gives {own.item():.6g} "
                       f"(eval mode): the regions do not compute the model (docs/runner.md)")


def sum_losses(losses: Dict[int, torch.Tensor]) -> torch.Tensor:
    """The step loss: the scaled microbatch losses summed in microbatch order."""
    total = None
    for mb in sorted(losses):
        total = losses[mb] if total is None else total + losses[mb]
    assert total is not None
    return total


def reference_step(model: PipelineModel, batches: Sequence[Any], seeds: Sequence[int], specs: Sequence[StageSpec],
                   order: Dict[int, List[int]]) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Plain step: each microbatch's loss and its gradients, summed over every microbatch in the
    plan's order, then divided by M, as the runner's ``reduce_grad`` scales them
    (hpr.exec.gradient-scaling); the step loss is the microbatch losses / M, summed.

    Returns:
        (gradient per parameter name, step loss).
    """
    names = [n for n, p in model.module.named_parameters() if p.requires_grad]
    params = dict(model.module.named_parameters())
    num_mb = len(batches)
    chain = Unit("reference", False, model.regions)
    per_mb: Dict[int, Dict[str, torch.Tensor]] = {}
    losses: Dict[int, torch.Tensor] = {}
    for mb, batch in enumerate(batches):
        loss = chain(batch, batch, seeds[mb])
        grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        per_mb[mb] = {n: g for n, g in zip(names, grads) if g is not None}
        losses[mb] = loss.detach() / num_mb
    owner = {n: s.stage for s in specs for n in s.params}
    out: Dict[str, torch.Tensor] = {}
    for name in names:
        acc = None
        planned = order[owner[name]]
        for mb in planned + [m for m in range(num_mb) if m not in planned]:
            g = per_mb[mb].get(name)
            if g is None:
                continue
            acc = g if acc is None else acc.add_(g)
        if acc is not None:
            out[name] = acc.div_(num_mb)
    return out, sum_losses(losses)


def _differences(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], label: str, exact: bool,
                 rtol: float, atol: float) -> Tuple[List[str], float]:
    """Names (prefixed by ``label``) whose tensors differ or exist on one side only, and the largest difference."""
    bad: List[str] = []
    worst = 0.0
    for name in sorted(set(got) | set(want)):
        a, b = got.get(name), want.get(name)
        if a is None or b is None or a.shape != b.shape:
            bad.append(f"{label}{name} ({'on one side only' if a is None or b is None else 'shape'})")
            worst = math.inf
            continue
        diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        worst = max(worst, diff)
        if not (torch.equal(a, b) if exact else torch.allclose(a.double(), b.double(), rtol=rtol, atol=atol)):
            bad.append(f"{label}{name} (max abs diff {diff:.3g})")
    return bad, worst


def compare(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor], got_loss: torch.Tensor,
            want_loss: torch.Tensor, got_buffers: Dict[str, torch.Tensor], want_buffers: Dict[str, torch.Tensor],
            exact: bool, rtol: float = 1e-5, atol: float = 1e-6) -> Dict[str, Any]:
    """Compares gradients, loss and updated buffers; ``exact`` means ``torch.equal``, else ``allclose``.

    Returns:
        ``{"grads_match", "buffers_match", "max_abs_diff", "mismatched"}`` (at most 5 names;
        ``max_abs_diff`` over gradients and loss).
    """
    grads, worst = _differences({**got, "(loss)": got_loss}, {**want, "(loss)": want_loss}, "", exact, rtol, atol)
    buffers, _ = _differences(got_buffers, want_buffers, "buffer ", exact, rtol, atol)
    return {"grads_match": not grads, "buffers_match": not buffers, "max_abs_diff": worst,
            "mismatched": (grads + buffers)[:5]}


def buffer_snapshot(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Copies of every buffer, for ``updated_buffers``."""
    return {n: b.detach().clone() for n, b in module.named_buffers()}


def updated_buffers(module: torch.nn.Module, before: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Buffers whose values differ from ``before`` (cloned).

    Values, not version counters: ``native_batch_norm`` updates ``running_mean`` in place
    without bumping its version.
    """
    return {n: b.detach().clone() for n, b in module.named_buffers() if n not in before or not torch.equal(b, before[n])}


@torch.no_grad()
def sgd_update(module: torch.nn.Module, grads: Dict[str, torch.Tensor], names: Sequence[str]) -> None:
    """``p -= LR * grad`` for ``names`` (the same op in the runner and the reference)."""
    params = dict(module.named_parameters())
    for name in names:
        if name in grads:
            params[name].sub_(grads[name] * LR)
