"""A deep residual MLP (16 blocks): the bundled model with many small regions.

Why it exists: a chain of identical cheap regions stresses the planner and
the balanced partition without any attention-specific ops.
"""

import torch
import torch.nn as nn

__all__ = ["IN", "WIDTH", "LAYERS", "BATCH", "Block", "DeepMLP", "build"]

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
