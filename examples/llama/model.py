"""A small Llama in torchtitan's layout: the plain module ``python -m hp_recompute.costs --module``
measures with no adapter.

Why this model: it is what a torchtitan user brings (``torchtitan/models/llama3/model.py``):
``layers`` is an ``nn.ModuleDict`` keyed ``"0"``, ``"1"``, ...; RMSNorm; rotary embeddings
applied through complex numbers from a ``freqs_cis`` buffer every layer receives; grouped-query
attention through ``F.scaled_dot_product_attention``; a SwiGLU feed-forward. ``forward`` returns
logits, no loss. Sizes are small, so that a 2-rank run on two CPU cores takes seconds.

``build`` returns the plain ``Transformer`` (costs, export). ``pipeline`` returns the same model
as the runner's ``PipelineModel`` (the runner executes named region functions and needs the loss
in the last one; docs/runner.md): regions ``tok_embeddings``, ``layers.N``, ``norm+output``, the
names ``python -m hp_recompute.costs --module`` gives the segments, with next-token
cross-entropy after ``output``.

torch >= 2.0 (``F.scaled_dot_product_attention``); on torch 1.13 ``build`` raises saying so.

    python -m hp_recompute.costs --module examples/llama/model.py:build \\
        --input-shape 2x64 --input-dtype int64 -o llama.costed.json
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ModelArgs", "RMSNorm", "Attention", "FeedForward", "TransformerBlock", "Transformer", "build",
           "pipeline", "BATCH", "SEQ"]

BATCH = 2
SEQ = 64


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 256
    multiple_of: int = 32
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = SEQ


class RMSNorm(nn.Module):
    """torchtitan's RMSNorm (``nn.RMSNorm`` is torch >= 2.4): x / rms(x) * weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_float = x.float()
        normed = x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(
        bs, slen, n_kv_heads * n_rep, head_dim)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        rep = self.n_heads // self.n_kv_heads
        keys, values = repeat_kv(xk, rep), repeat_kv(xv, rep)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, dim: int, multiple_of: int) -> None:
        super().__init__()
        hidden = int(2 * (4 * dim) / 3)
        hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.multiple_of)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Token ids [batch, seq] (int64) -> logits [batch, seq, vocab]."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer("freqs_cis", precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len,
                                                               args.rope_theta), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 / math.sqrt(1 if p is self.tok_embeddings.weight else 2))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # A pipeline stage keeps the parts it owns, the others None (torchtitan's stage modules).
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def stage_module(full: Transformer, stage: int, stages: int) -> Transformer:
    """Stage ``stage`` of ``stages`` as torchtitan builds it: a copy of ``full`` with its share
    of the layers (``n_layers / stages`` in order), the embedding on the first stage and the
    norm and output on the last; every kept part keeps the full model's FQN."""
    module = copy.deepcopy(full)
    per = len(full.layers) // stages
    for name in list(module.layers.keys()):
        if not stage * per <= int(name) < (stage + 1) * per:
            del module.layers[name]
    if stage != 0:
        module.tok_embeddings = None
    if stage != stages - 1:
        module.norm = module.output = None
    return module


def _require_sdpa() -> None:
    if not hasattr(F, "scaled_dot_product_attention"):
        raise RuntimeError(f"examples/llama/model.py needs F.scaled_dot_product_attention (torch >= 2.0); this is "
                           f"torch {torch.__version__}")


def build() -> Transformer:
    """The plain module (seeded: every process builds the same weights)."""
    _require_sdpa()
    torch.manual_seed(0)
    return Transformer(ModelArgs())


def _loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def pipeline():
    """The same model as the runner's ``PipelineModel`` (module doc)."""
    from hp_recompute.runner.model import PipelineModel, Region, parameters_under

    m = build()

    def params(*prefixes: str):
        return parameters_under(m, *prefixes)

    def layer(key: str):
        return lambda x, batch: m.layers[key](x, m.freqs_cis)

    regions = [Region("tok_embeddings", lambda tokens, batch: m.tok_embeddings(tokens), params("tok_embeddings"),
                      False)]
    regions += [Region(f"layers.{k}", layer(k), params(f"layers.{k}")) for k in m.layers]
    regions.append(Region("norm+output", lambda h, tokens: _loss(m.output(m.norm(h)), tokens),
                          params("norm", "output"), False))
    vocab = m.args.vocab_size
    return PipelineModel("llama", m, regions, lambda g: torch.randint(0, vocab, (BATCH, SEQ), generator=g),
                         lambda tokens: _loss(m(tokens), tokens))
