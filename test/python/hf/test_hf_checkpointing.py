"""``hp_recompute.hf.enable_checkpointing``: HF's gradient checkpointing through our checkpoint.

Against the real transformers package: a model so prepared trains as HF's own gradient
checkpointing does (same losses and gradients, the same layer forwards), and inside a
recompute session each decoder layer is one region, replayed once for a dx/dw split
backward where torch's checkpoint replays it for each half.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch

pytest.importorskip("transformers", reason="needs transformers (requirements.txt)")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_models  # noqa: E402

import hp_recompute as hr  # noqa: E402
from hp_recompute import hf  # noqa: E402
from hp_recompute.errors import RunError  # noqa: E402

FAMILIES = ["llama", "qwen2", "gpt2"]


def _count_layer_calls(model: torch.nn.Module) -> Dict[str, int]:
    """Calls of each decoder layer's MLP (inside the layer, so replays count too)."""
    calls: Dict[str, int] = {}
    for name, module in model.named_modules():
        if name.endswith(".mlp"):
            def hook(*_: object, name: str = name) -> None:
                calls[name] = calls.get(name, 0) + 1
            module.register_forward_pre_hook(hook)
    return calls


def _batch() -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, hf_models.VOCAB, (2, hf_models.SEQ), generator=g) for _ in range(2)]


@pytest.mark.parametrize("family", FAMILIES)
def test_trains_as_hf_own_checkpointing(family: str) -> None:
    theirs, ours = hf_models.build(family, use_cache=True), hf_models.build(family, use_cache=True)
    theirs.activation_checkpointing_enable()
    assert hf.enable_checkpointing(ours) is ours
    theirs.train(), ours.train()
    calls = [_count_layer_calls(theirs), _count_layer_calls(ours)]
    x, y = _batch()
    losses = [m(x, labels=y).loss for m in (theirs, ours)]
    for loss in losses:
        loss.backward()
    assert torch.equal(losses[0], losses[1])
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-6, msg=name)
    assert calls[0] == calls[1] == {f"{hf.LAYOUTS[family].base}.{hf.LAYOUTS[family].layers}.{i}.mlp": 2
                                    for i in range(4)}
    # Plain torch: the layers really run under hp_recompute's checkpoint (a frame per layer).
    with hr.recompute_handle_collector_ctx() as handles:
        ours(x, labels=y)
    assert len(handles) == 4


def test_one_replay_per_layer_for_a_split_backward() -> None:
    """torch's checkpoint replays each layer once for dx and again for dw; a session once."""
    reference, model = hf_models.build("llama"), hf_models.build("llama")
    hf.enable_checkpointing(model)
    model.train()
    x, y = _batch()
    reference(x, labels=y).loss.backward()
    calls = _count_layer_calls(model)
    with hr.recompute_handle_collector_ctx() as handles:
        loss = model(x, labels=y).loss
    for handle in handles:
        hr.recompute_handle(handle, "s0.mb0")
    weights = [p for p in model.parameters() if p.requires_grad]
    with hr.recompute_session_ctx("s0.mb0", retain_on_unpack=True):
        _, state = hr.backward_input([loss], None, [], weights)
        grads = hr.backward_weight(state)
    hr.clear_recompute_session("s0.mb0")
    assert calls == {f"model.layers.{i}.mlp": 2 for i in range(4)}
    for (name, p), grad in zip(reference.named_parameters(), grads):
        torch.testing.assert_close(grad, p.grad, rtol=0, atol=1e-6, msg=name)


def test_refusals() -> None:
    with pytest.raises(RunError, match=r"expected a transformers PreTrainedModel, got Linear"):
        hf.enable_checkpointing(torch.nn.Linear(2, 2))
    with pytest.raises(RunError, match=r"every_n_layers must be an integer >= 1, got 0"):
        hf.enable_checkpointing(hf_models.build("llama"), every_n_layers=0)
