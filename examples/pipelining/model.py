"""A small decoder in torchtitan's layout, for the torch.distributed.pipelining example.

Why this layout: torchtitan splits a model for pipelining by deleting what a stage does
not own (``del model.layers[name]``, ``model.norm = None``) from a copy of the whole
model, so every stage module keeps the full model's FQNs (``layers.3.attention.wqkv``).
``forward`` therefore skips what is missing. The plan names the same FQNs as regions.
"""

import torch
import torch.nn as nn

__all__ = ["VOCAB", "DIM", "LAYERS", "SEQ", "BATCH", "Block", "Decoder", "build", "stage_module"]

VOCAB = 96
DIM = 32
LAYERS = 8
SEQ = 16
BATCH = 8


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual."""

    def __init__(self, dim: int, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.attention_norm = nn.LayerNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim)
        self.wo = nn.Linear(dim, dim)
        self.ffn_norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (u.transpose(1, 2) for u in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * self.scale
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.wo(att.transpose(1, 2).reshape(b, t, d))
        return x + self.w2(torch.nn.functional.gelu(self.w1(self.ffn_norm(x))))


class Decoder(nn.Module):
    """Token ids [batch, SEQ] (int64) -> logits [batch, SEQ, VOCAB]."""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM, layers: int = LAYERS) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim) for i in range(layers)})
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def build() -> Decoder:
    torch.manual_seed(0)
    return Decoder()


def stage_module(model: Decoder, regions) -> Decoder:
    """The stage that owns ``regions`` (region names from the plan): ``model`` with everything else deleted.

    A region of several modules is named by their FQNs joined with ``+`` (``norm+output``).
    """
    owned = {fqn for region in regions for fqn in region.split("+")}
    for name in list(model.layers.keys()):
        if f"layers.{name}" not in owned:
            del model.layers[name]
    for name in ("tok_embeddings", "norm", "output"):
        if name not in owned:
            setattr(model, name, None)
    return model
