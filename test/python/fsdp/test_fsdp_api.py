"""hp_recompute.fsdp without processes: the torch-version gate and modules without FSDP (hpr.fsdp.supported)."""

from __future__ import annotations

import pytest
import torch

import hp_recompute as hr
from hp_recompute import fsdp


def test_without_fsdp2_the_step_functions_say_so_and_with_it_a_plain_module_has_no_step() -> None:
    module = torch.nn.Linear(2, 2)
    if not fsdp.FSDP_AVAILABLE:  # Debian's torch 1.13
        for fn in (fsdp.reduce_gradients, fsdp.begin_step):
            with pytest.raises(hr.CheckpointError, match=r"^hp_recompute: \w+: torch .* has no FSDP2 "
                               r"\(torch.distributed.fsdp.fully_shard, torch >= 2.6\)"):
                fn(module)
    else:
        assert fsdp.begin_step(module) is False
        assert fsdp.reduce_gradients(module) is False
    assert fsdp.discard_step(module) is False
    assert not fsdp.is_fsdp_module(module)


def test_checkpoint_wrapper_of_a_module_without_fsdp_replays_it_by_its_own_name() -> None:
    block = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
    wrapped = hr.checkpoint_wrapper(block)
    x = torch.randn(2, 3, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        out = wrapped(x).sum()
    assert "'Sequential'" in repr(handles[0])
    hr.recompute_handle(handles[0], "api.s0")
    try:
        with hr.recompute_session_ctx("api.s0"):
            out.backward()
    finally:
        hr.clear_recompute_session("api.s0")
    want = torch.autograd.grad(block(x).sum(), list(block.parameters()))
    for p, g in zip(block.parameters(), want):
        torch.testing.assert_close(p.grad, g)


def test_importing_hp_recompute_leaves_fsdp_unimported_until_asked() -> None:
    """``torch.distributed.fsdp`` is a third of ``import hp_recompute`` and is loaded on first
    use; asking whether FSDP2 is there loads it and says what this torch has."""
    import subprocess
    import sys

    code = ("import sys, hp_recompute\n"
            "print('torch.distributed.fsdp' in sys.modules)\n"
            "print(hp_recompute.fsdp.FSDP_AVAILABLE)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", str(fsdp.FSDP_AVAILABLE)]
