"""torchtitan's composition around the dx/dw split: FSDP2 or HSDP with a selective policy,
bfloat16 autocast, gradient accumulation over microbatches, prefetched replays, and
``block.compile()``.

Each case runs fsdp_worker.py's step (see test_fsdp_split.py) with more of the stack
switched on; the gradients must still equal the unsharded model's and plain FSDP's, with
one replay per block and microbatch and one reduction per parameter group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from test_fsdp_split import _has_fsdp2, check_step, run_case

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not _has_fsdp2(),
    reason=f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6)")]


@pytest.mark.parametrize("reshard", [True, False], ids=["reshard_after_forward", "keep_after_forward"])
def test_selective_policy_prefetched_and_split(tmp_path: Path, reshard: bool) -> None:
    """The prefetch unshards outside the policy's recompute context: FSDP's all-gather is
    not an op of the region (torch's SAC would refuse it as one it never saw)."""
    results = run_case(tmp_path, reshard=reshard, microbatches=2, prefetch=True, selective=True)
    check_step(results, 2)
    for res in results:
        assert res["session_replays"] == 2 * 2, res["session_replays"]
        assert res["sharded_after_prefetch"] == res["sharded_before_prefetch"]


def test_hsdp_selective_autocast_accumulated(tmp_path: Path) -> None:
    check_step(run_case(tmp_path, ranks=4, hsdp=True, microbatches=2, prefetch=True, selective=True,
                        autocast=True), 2, hsdp=True)


@pytest.mark.skipif(not __import__("hp_recompute").compile_split.SUPPORTED,
                    reason="the compiled dx/dw split needs torch >= 2.13")
@pytest.mark.parametrize("reshard", [True, False], ids=["reshard_after_forward", "keep_after_forward"])
def test_compiled_blocks_prefetched_and_split(tmp_path: Path, reshard: bool) -> None:
    """``block.compile()`` on the sharded wrapper compiles the block inside the checkpoint
    (hpr.compiled-split.wrapper-compile): the forward hands out handles, the prefetch
    unshards, and I and W of the compiled blocks give FSDP's gradients."""
    results = run_case(tmp_path, reshard=reshard, microbatches=2, prefetch=True, compile="aot_eager")
    check_step(results, 2)
    for res in results:
        assert res["handles"] == [2, 2] and res["session_replays"] == 2 * 2, res
        assert res["compiled_graphs"] > 0


@pytest.mark.skipif(not __import__("hp_recompute").compile_split.SUPPORTED,
                    reason="the compiled dx/dw split needs torch >= 2.13")
def test_hsdp_compiled_selective_autocast_accumulated(tmp_path: Path) -> None:
    """The whole stack at once: HSDP 2 x 2, blocks with a selective policy compiled inside
    their checkpoint, bfloat16 autocast, two accumulated microbatches, prefetched replays."""
    results = run_case(tmp_path, ranks=4, hsdp=True, microbatches=2, prefetch=True, selective=True, autocast=True,
                       compile="aot_eager")
    check_step(results, 2, hsdp=True)
    for res in results:
        assert res["session_replays"] == 2 * 2 and res["compiled_graphs"] > 0, res["session_replays"]
