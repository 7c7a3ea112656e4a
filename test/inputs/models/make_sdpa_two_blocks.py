"""Writes sdpa_two_blocks.pt: two attention blocks with F.scaled_dot_product_attention,
traced by torch 2.x (run with the venv's python). torch 1.13's LibTorch has no such op.

The planner imports it with --input-shape 2x8x16 when built against LibTorch 2.x
(lit: tools/hp-recompute-plan/torchscript-newer-torch.test).
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + y.transpose(1, 2).reshape(b, t, d)


class TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.sum()


if __name__ == "__main__":
    torch.manual_seed(0)
    traced = torch.jit.trace(TwoBlocks(), (torch.randn(2, 8, 16),))
    traced.save(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "sdpa_two_blocks.pt"))
