"""A small residual CNN: the bundled model with convolutions and batch norm.

Why it exists: convolution FLOPs and batch-norm saved statistics follow
different rules from the transformer's; this keeps those rules tested.
"""

import torch
import torch.nn as nn

__all__ = ["CHANNELS", "BLOCKS", "SIZE", "BATCH", "ResBlock", "SmallCNN", "build"]

CHANNELS = 16
BLOCKS = 4
SIZE = 16
BATCH = 4


class ResBlock(nn.Module):
    """relu(x + bn(conv(relu(bn(conv(x))))))."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class SmallCNN(nn.Module):
    """Images [batch, 3, SIZE, SIZE] (float32) -> logits [batch, 10]."""

    def __init__(self, channels: int = CHANNELS, blocks: int = BLOCKS) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.stages = nn.ModuleList([ResBlock(channels) for _ in range(blocks)])
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(channels * (SIZE // 2) * (SIZE // 2), 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        for stage in self.stages:
            h = stage(h)
        return self.fc(self.pool(h).flatten(1))


def build() -> SmallCNN:
    """Returns the bundled CNN with deterministic weights (seed 0)."""
    torch.manual_seed(0)
    return SmallCNN()
