"""A small Llama as transformers builds it, for the Hugging Face walkthrough (docs/huggingface.md).

``build()`` is the model with its default configuration (``use_cache=True``), which
``python -m hp_recompute.costs --module`` refuses (its KV cache grows with every measured
call); ``build_for_training()`` turns the cache off, as training with checkpointing does.
Every rank builds the same weights (one seed).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, SEQ = 512, 64


def build() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=SEQ,
                         bos_token_id=0, eos_token_id=1)
    return LlamaForCausalLM(config)


def build_for_training() -> LlamaForCausalLM:
    model = build()
    model.config.use_cache = False
    return model
