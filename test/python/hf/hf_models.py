"""Tiny configurations of the transformers families ``hp_recompute.hf`` supports, built from
a fixed seed (every rank builds the same weights), dropout off (gradients compare exactly)."""

from __future__ import annotations

import torch
import transformers

VOCAB, SEQ = 256, 16

_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1)


def build(family: str, use_cache: bool = False, tie: bool = False, full_layers: int = 2) -> torch.nn.Module:
    """The ``*ForCausalLM`` of ``family`` (a ``hp_recompute.hf.LAYOUTS`` key); a Qwen2's layers
    from ``full_layers`` on attend in a sliding window."""
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=4, n_head=4, n_positions=64,
                                         bos_token_id=0, eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, use_cache=use_cache,
                                         tie_word_embeddings=tie)
        return transformers.GPT2LMHeadModel(config)
    configs = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "qwen2": transformers.Qwen2Config, "phi3": transformers.Phi3Config}
    extra = {}
    if family == "qwen2":  # sliding-window attention on the upper layers: per-layer types differ by stage
        extra = dict(use_sliding_window=True, sliding_window=4, max_window_layers=full_layers)
    if family == "phi3":
        extra = dict(pad_token_id=2)
    config = configs[family](**_COMMON, use_cache=use_cache, tie_word_embeddings=tie, **extra)
    cls = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM,
           "qwen2": transformers.Qwen2ForCausalLM, "phi3": transformers.Phi3ForCausalLM}[family]
    return cls(config)


def llama() -> torch.nn.Module:
    """A factory for ``--module hf_models.py:llama``: as HF builds it (``use_cache`` on)."""
    return build("llama", use_cache=True)


def llama_no_cache() -> torch.nn.Module:
    return build("llama", use_cache=False)


def qwen2_sliding() -> torch.nn.Module:
    """A Qwen2 whose every layer attends in a sliding window, as HF builds it (``use_cache``
    on): its cache keeps the window, so a layer called again on the same arguments fails."""
    return build("qwen2", use_cache=True, full_layers=0)


def gpt2() -> torch.nn.Module:
    return build("gpt2")


def gpt2_tied() -> torch.nn.Module:
    return build("gpt2", tie=True)


def llama_checkpointed() -> torch.nn.Module:
    """A Llama with Hugging Face's own gradient checkpointing on."""
    model = build("llama")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model
