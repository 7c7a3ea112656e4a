"""A tiny GPT-style decoder (8 blocks) used as hp-recompute's bundled model.

``build()`` writes attention with plain matmuls (it runs on torch 1.13 too);
``build_sdpa()`` is the same model with ``F.scaled_dot_product_attention``, as
torch 2.x models write it (gpt-sdpa.pt2 is its torch.export program).

``pipeline()`` is ``build()``'s model as the runner's ``PipelineModel``: the
regions ``tok_emb``, ``blocks.N`` and ``ln_f+head`` (the names the CLI's
gpt.model.json plans), batches of BATCH sequences of token ids.

Why it exists: the CLI plans it by default (gpt.model.json) and the runner
runs it by default (``pipeline``), so the factories are importable on their own
and deterministic (fixed seed). Dimensions are tiny so CPU tests stay fast.
"""

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["VOCAB", "DIM", "HEADS", "LAYERS", "SEQ", "BATCH", "Block", "GPT", "build",
           "build_sdpa", "pipeline"]

VOCAB = 64
DIM = 48
HEADS = 4
LAYERS = 8
SEQ = 40
BATCH = 4


class Attention(nn.Module):
    """Causal multi-head self-attention: plain matmuls (torch 1.13 has no SDPA), or SDPA."""

    def __init__(self, dim: int, heads: int, seq: int, sdpa: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.scale = 1.0 / math.sqrt(dim // heads)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        hd = d // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(self.mask[:t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)


class MLP(nn.Module):
    """The 4x feed-forward of a transformer block."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """One pre-norm transformer block: the unit hp-recompute checkpoints."""

    def __init__(self, dim: int, heads: int, seq: int, sdpa: bool = False) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, seq, sdpa)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token ids [batch, seq] (int64) -> next-token cross-entropy loss (a scalar)."""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM, heads: int = HEADS,
                 layers: int = LAYERS, seq: int = SEQ, sdpa: bool = False) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.pos_emb = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim, heads, seq, sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb[:t]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               idx[:, 1:].reshape(-1))


def build() -> GPT:
    """Returns the bundled GPT with deterministic weights (seed 0)."""
    torch.manual_seed(0)
    return GPT()


def build_sdpa() -> GPT:
    """The bundled GPT with SDPA attention (torch 2.x), deterministic weights (seed 0)."""
    torch.manual_seed(0)
    return GPT(sdpa=True)


def pipeline(m: Optional[GPT] = None):
    """``m`` (default ``build()``) as ``hp_recompute.runner.PipelineModel`` (module doc)."""
    from hp_recompute.runner.model import PipelineModel, Region, parameters_under

    m = build() if m is None else m

    def emb(idx: torch.Tensor, batch) -> torch.Tensor:
        return m.tok_emb(idx) + m.pos_emb[: idx.shape[1]]

    def block(i: int):
        return lambda x, batch: m.blocks[i](x)

    def head(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        logits = m.head(m.ln_f(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))

    regions = [Region("tok_emb", emb, parameters_under(m, "tok_emb", "pos_emb"), False)]
    regions += [Region(f"blocks.{i}", block(i), parameters_under(m, f"blocks.{i}")) for i in range(len(m.blocks))]
    regions.append(Region("ln_f+head", head, parameters_under(m, "ln_f", "head"), False))
    return PipelineModel("gpt", m, regions, lambda g: torch.randint(0, m.tok_emb.num_embeddings, (BATCH, m.pos_emb.shape[0]), generator=g),
                         lambda idx: m(idx))
