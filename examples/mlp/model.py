"""A deep residual MLP (16 blocks): the bundled model with many small regions.

``pipeline()`` is ``build()``'s model as the runner's ``PipelineModel``: the
regions ``inp``, ``layers.N`` and ``head`` (with the cross-entropy), batches of
BATCH feature rows and class labels.

Why it exists: a chain of identical cheap regions stresses the planner and
the balanced partition without any attention-specific ops.
"""

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["IN", "WIDTH", "LAYERS", "BATCH", "Block", "DeepMLP", "build", "pipeline"]

IN = 32
WIDTH = 64
LAYERS = 16
BATCH = 8


class Block(nn.Module):
    """Residual two-layer perceptron: x + fc2(gelu(fc1(x)))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class DeepMLP(nn.Module):
    """Features [batch, IN] (float32) -> logits [batch, 10]."""

    def __init__(self, inp: int = IN, width: int = WIDTH, layers: int = LAYERS) -> None:
        super().__init__()
        self.inp = nn.Linear(inp, width)
        self.layers = nn.ModuleList([Block(width) for _ in range(layers)])
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def build() -> DeepMLP:
    """Returns the bundled MLP with deterministic weights (seed 0)."""
    torch.manual_seed(0)
    return DeepMLP()


def pipeline(m: Optional[nn.Module] = None):
    """``m`` (default ``build()``), a module laid out as ``DeepMLP`` (``inp``, ``layers``,
    ``head``), as ``hp_recompute.runner.PipelineModel`` (module doc)."""
    from hp_recompute.runner.model import PipelineModel, Region, parameters_under

    m = build() if m is None else m
    features, classes = m.inp.in_features, m.head.out_features

    def inp(batch, _) -> torch.Tensor:
        return torch.relu(m.inp(batch[0]))

    def layer(i: int):
        return lambda x, batch: m.layers[i](x)

    def head(x: torch.Tensor, batch) -> torch.Tensor:
        return F.cross_entropy(m.head(x), batch[1])

    def make_batch(g: torch.Generator):
        return (torch.randn(BATCH, features, generator=g), torch.randint(0, classes, (BATCH,), generator=g))

    regions = [Region("inp", inp, parameters_under(m, "inp"), False)]
    regions += [Region(f"layers.{i}", layer(i), parameters_under(m, f"layers.{i}")) for i in range(len(m.layers))]
    regions.append(Region("head", head, parameters_under(m, "head"), False))
    return PipelineModel("mlp", m, regions, make_batch, lambda b: F.cross_entropy(m(b[0]), b[1]))
