"""The dx/dw split on FSDP2 (``fully_shard``) and HSDP modules, on gloo with 2 and 4 CPU ranks.

NOTE [ FSDP2 and the dx/dw split ] in ``hp_recompute/fsdp.py``. Each case spawns gloo
ranks (fsdp_worker.py) that wrap a tiny model as torchtitan does and run one step split
into I and W; the full gradients must equal those of the unsharded model and of the same
FSDP model with plain ``loss.backward()``; FSDP must reduce exactly once per parameter
group per step (one reduce-scatter, plus one all-reduce for HSDP), after the last W.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch


def _has_fsdp2() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # noqa: BLE001 -- ImportError; torch 1.13 under Python 3.11 raises ValueError
        return False
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not _has_fsdp2(),
    reason=f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6)")]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
import fsdp_worker  # noqa: E402
from rank_processes import spawn_ranks  # noqa: E402

GROUPS = 3  # FSDP parameter groups: block 0, block 1, the root (head)


def run_case(tmp: Path, ranks: int = 2, **cfg: Any) -> List[Dict[str, Any]]:
    out = tmp / "out"
    out.mkdir()
    cfg = {"python": str(REPO / "python"), "store": str(tmp / "store"), "ranks": ranks, "out": str(out),
           "microbatches": 1, "reshard": True, **cfg}
    results = spawn_ranks(fsdp_worker.main, cfg, ranks)
    for rank, res in enumerate(results):
        assert "exception" not in res, f"rank {rank}:\n{res.get('exception')}"
    return results


def check_step(results: List[Dict[str, Any]], microbatches: int, hsdp: bool = False, held: bool = False) -> None:
    for rank, res in enumerate(results):
        for name, got, want, plain in zip(res["names"], res["grads"], res["ref"], res["plain"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"rank {rank} {name} vs unsharded")
            torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6, msg=f"rank {rank} {name} vs plain FSDP")
        assert res["reduced"] is True and res["reduced_again"] is False
        comms = res["comms"]
        # Nothing reduced inside I and W; exactly one reduce-scatter per group at the reduce,
        # plus one all-reduce over the replicate dimension for HSDP.
        for phase in ("forward", "prefetch", "backward"):
            assert "reduce_scatter" not in comms.get(phase, {}), (rank, phase, comms)
            assert "all_reduce" not in comms.get(phase, {}), (rank, phase, comms)
        want = {"reduce_scatter": GROUPS, **({"all_reduce": GROUPS} if hsdp else {})}
        assert {k: v for k, v in comms["reduce"].items() if k != "all_gather"} == want, (rank, comms)
        assert "after" not in comms, (rank, comms)
        # Before the reduce no sharded gradient exists: W accumulated into FSDP's unsharded ones,
        # which a held step's modules still hold as their parameters' ``.grad``.
        assert res["grads_before_reduce"] == [held] * len(res["names"]), rank
        # One replay per block and microbatch, I and W sharing it.
        assert res["replays"] == 2 * microbatches, (rank, res["replays"])
        assert res["live_sessions"] == 0
        # FSDP's own settings are back: a plain backward afterwards reduces and adds.
        assert "reduce_scatter" in comms["plain_after"], (rank, comms)
        assert any(not torch.equal(a, b) for a, b in zip(res["plain_after"], res["grads"]))


@pytest.mark.parametrize("reshard", [True, False], ids=["reshard_after_forward", "keep_after_forward"])
def test_split_gives_the_gradients_of_one_backward(tmp_path: Path, reshard: bool) -> None:
    results = run_case(tmp_path, reshard=reshard)
    check_step(results, 1)
    for res in results:
        assert res["sharded_after_step"] == [True, True]  # reshard_after_backward (FSDP's default)


@pytest.mark.parametrize("no_input", [False, True], ids=["with_input", "stage0_no_input"])
def test_two_microbatches_accumulate_and_reduce_once(tmp_path: Path, no_input: bool) -> None:
    """Ws of two microbatches after both Is; with no input gradient (stage 0) W is the whole backward."""
    check_step(run_case(tmp_path, microbatches=2, no_input=no_input), 2)


@pytest.mark.parametrize("reshard", [True, False], ids=["reshard_after_forward", "keep_after_forward"])
def test_prefetched_replay_runs_unsharded_and_is_shared_by_i_and_w(tmp_path: Path, reshard: bool) -> None:
    results = run_case(tmp_path, reshard=reshard, microbatches=2, prefetch=True)
    check_step(results, 2)
    for res in results:
        assert res["session_replays"] == 2 * 2, res["session_replays"]  # the prefetches, nothing more
        # Left as FSDP had them: resharded after the forward, or kept unsharded; the second
        # microbatch's prefetch comes after the first one's I, which resharded them
        # (reshard_after_backward, FSDP's default).
        assert res["sharded_before_prefetch"] == [[reshard, reshard], [True, True]]
        assert res["sharded_after_prefetch"] == res["sharded_before_prefetch"]


@pytest.mark.parametrize("reshard", [True, False], ids=["reshard_after_forward", "keep_after_forward"])
def test_a_step_that_holds_the_parameters_gathers_each_block_once(tmp_path: Path, reshard: bool) -> None:
    """``begin_step(model, hold_parameters=True)`` after the forwards (PlannedSchedule's steps):
    each parameter group sharded then is gathered once (the blocks by the first prefetch, the
    root by the first I) and stays gathered for the second microbatch's prefetch, every I
    and W; the reduce reshards as FSDP was configured."""
    results = run_case(tmp_path, reshard=reshard, microbatches=2, prefetch=True, hold=True)
    check_step(results, 2, held=True)
    for rank, res in enumerate(results):
        assert res["held"] is True
        assert res["sharded_before_prefetch"] == [[reshard, reshard], [False, False]], rank
        assert res["sharded_after_prefetch"] == [[False, False], [False, False]], rank
        gathers = [res["comms"].get(phase, {}).get("all_gather", 0) for phase in ("prefetch", "backward")]
        assert gathers == ([2, GROUPS - 2] if reshard else [0, 0]), (rank, res["comms"])
        assert res["sharded_after_step"] == [True, True]


def test_a_discarded_holding_step_reshards_and_restores_fsdp(tmp_path: Path) -> None:
    """A step that fails after its Is: ``discard_step`` reshards what the step held and gives
    FSDP its settings back, so the next plain backward reduces and reshards as usual."""
    for rank, res in enumerate(run_case(tmp_path, microbatches=1, prefetch=True, hold="discard")):
        assert res["discarded"] is True and res["sharded_after_discard"] == [True, True], rank
        assert "reduce_scatter" in res["comms"]["plain_after"], (rank, res["comms"])
        assert res["sharded_after_plain"] == [True, True], rank


def test_hsdp_2x2(tmp_path: Path) -> None:
    check_step(run_case(tmp_path, ranks=4, hsdp=True, microbatches=2, prefetch=True), 2, hsdp=True)


def test_reduce_before_the_last_w_is_refused_then_a_w_of_the_discarded_step(tmp_path: Path) -> None:
    """REDUCE_GRAD before a W: refused, naming the weights, nothing reduced; after
    ``discard_step`` the W of that step is refused too, never silently unreduced."""
    for res in run_case(tmp_path, bad="reduce_before_w"):
        assert res["error"].startswith(
            "hp_recompute: reduce_gradients(FSDPSequential): 1 backward_input of this step has no backward_weight "
            "yet (weights '0._checkpoint_wrapped_module.0.weight', '0._checkpoint_wrapped_module.0.bias'"), res["error"]
        assert res["error"].endswith(" [hpr.fsdp.reduce-once]"), res["error"]
        assert "reduce" not in res["comms"], res["comms"]  # refused before any collective
        assert res["discarded"] is True
        assert res["w_error"].startswith("hp_recompute: backward_weight: the step of FSDPSequential this W belongs "
                                         "to was already reduced or discarded"), res["w_error"]
        assert "'0._checkpoint_wrapped_module.0.weight'" in res["w_error"], res["w_error"]
        assert res["w_error"].endswith(" [hpr.fsdp.dw-accumulates]"), res["w_error"]
        assert all(g is None for g in res["grads"])


def test_a_parameter_the_graph_does_not_reach_is_named(tmp_path: Path) -> None:
    for res in run_case(tmp_path, bad="unreached"):
        assert res["error"].startswith("hp_recompute: backward_weight: weights '3.weight', '3.bias' are not "
                                       "reached by the graph of the outputs"), res["error"]
        assert "FSDP would reduce none" in res["error"] and "discard_step" in res["error"]
        assert res["discarded"] is True


def test_a_plain_backward_in_an_open_step_accumulates_and_is_reduced_once(tmp_path: Path) -> None:
    """B (``loss.backward()``) of microbatch 0 after ``begin_step``, I and W of microbatch 1:
    one reduction for both (hpr.fsdp.open-step)."""
    results = run_case(tmp_path, microbatches=2, plain_first=True)
    check_step(results, 2)
    assert all(res["began"] is True for res in results)
