"""PP x FSDP2 under PlannedSchedule: zero-bubble plans on stages wrapped as torchtitan does.

hpr.stages.our-split: the I/W split of a stage holding FSDP2 modules is hp_recompute's.
Each case spawns a (pp, dp) gloo mesh (pp_fsdp_worker.py) and runs a zero-bubble plan (2
pp ranks; ZBV: 4 stages in a V, ZB-H1: 2 stages; 4 microbatches; jit or bubble recompute),
on FSDP2 or HSDP, the blocks eager or compiled; the full gradients and losses must equal
the unsharded model's (mean over the dp ranks), every checkpointed block must run once in
the forward and replay once per microbatch, no session may outlive the step, and every
parameter must be sharded again at its end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch

pytest.importorskip("torch.distributed.pipelining", reason="needs torch.distributed.pipelining")
from hp_recompute import compile_split, fsdp, make_plan  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not fsdp.FSDP_AVAILABLE, reason="needs FSDP2 (torch >= 2.6)")]

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "fsdp"))  # fsdp_worker's selective policy and autocast
import pp_fsdp_worker  # noqa: E402
from rank_processes import spawn_ranks  # noqa: E402
from test_planned_schedule import DIM, LAYERS_PER_STAGE, REPO, model_json, stage_spec  # noqa: E402

MICROBATCHES = 4
# 2 pp ranks: a V (ZBV, DualPipeV) or a loop of two stages each, or one stage each
STAGES = {"zbv": 4, "dualpipev": 4, "interleaved-1f1b": 4, "zb-h1": 2, "1f1b": 2}


def run_case(tmp: Path, reshard: bool, prefetch: str, schedule: str = "zbv", dp: int = 2,
             hsdp: bool = False, unwrapped: bool = False, selective: bool = False,
             autocast: bool = False, planned_layout: bool = False, policy: Any = True,
             input_grad: bool = False, room: float = 0, eval: bool = False,
             frozen: bool = False, baseline: bool = False,
             compile: Optional[str] = None, accumulate: bool = False) -> List[Dict[str, Any]]:
    """Plans and runs one case; ``room`` > 0: the plan's memory budget is that many times jit's
    activation peak; ``compile``: each wrapped block's ``compile(backend=compile)``;
    ``accumulate``: the two steps accumulate their gradients."""
    stages = STAGES[schedule]
    layers = LAYERS_PER_STAGE * stages
    model_json(tmp / "model.json", layers, policy)
    plan = tmp / "plan.json"
    layout = {"dp_shard": 2, "dp_replicate": dp // 2} if planned_layout else {}  # docs/fsdp.md
    gen = dict(schedule_gen=schedule, model=tmp / "model.json", ranks=2, microbatches=MICROBATCHES,
               stages=stage_spec(stages), checkpoint="model", **layout)
    budget = {"memory_budget": int(room * max(make_plan(**gen)["summary"]["peak_bytes"]))} if room else {}
    plan.write_text(json.dumps(make_plan(**gen, prefetch=prefetch, **budget)))
    out = tmp / "out"
    out.mkdir()
    cfg = {"python": str(REPO / "python"), "store": str(tmp / "store"), "pp": 2, "dp": dp, "hsdp": hsdp,
           "stages": stages, "layers": layers, "dim": DIM, "batch": 2 * MICROBATCHES, "microbatches": MICROBATCHES,
           "torch_schedule": schedule, "reshard": reshard, "unwrapped": unwrapped, "selective": selective,
           "autocast": autocast, "input_grad": input_grad, "eval": eval, "frozen": frozen, "baseline": baseline,
           "compile": compile, "accumulate": accumulate, "plan": str(plan), "out": str(out)}
    results = spawn_ranks(pp_fsdp_worker.main, cfg, 2 * dp)
    for rank, res in enumerate(results):
        assert "exception" not in res, f"rank {rank}:\n{res['exception']}"
    return results


def check_collectives(results: List[Dict[str, Any]], hsdp: bool = False, exact: bool = True) -> None:
    """The plan owns the gathers (hpr.stages.plan-owns-gathers): in a step each FSDP module with parameters is
    all-gathered once and reduce-scattered once (all-reduced once over HSDP's replicas) on every
    rank, whatever ``reshard_after_forward`` says; with the baseline run, the step's collectives
    over all ranks are no more than those of torch's interleaved 1F1B with checkpointing on the
    same model, whose gradients are exact (unless ``exact`` is false: bf16 on compiled blocks)."""
    kinds = ("all_gather", "reduce_scatter") + (("all_reduce",) if hsdp else ())
    for rank, res in enumerate(results):
        for kind in kinds:
            assert res["collectives"].get(kind, 0) == res["sharding_modules"], (rank, kind, res["collectives"])
    if "baseline" in results[0]:
        assert all(res["baseline"]["exact"] for res in results) or not exact
        for kind in kinds:
            ours = sum(res["collectives"].get(kind, 0) for res in results)
            torch_ = sum(res["baseline"]["collectives"].get(kind, 0) for res in results)
            assert ours <= torch_, (kind, ours, results[0]["baseline"]["schedule"], torch_)


def check(results: List[Dict[str, Any]], plan: Optional[Path] = None, replayed: bool = True,
          split: bool = True) -> None:
    """Exact gradients and losses, one replay per block and microbatch (none with ``replayed``
    false), nothing left live, gathered or received (hpr.stages.step-buffers); with ``plan``, every unshard
    and reshard of the rank's program ran (hpr.stages.plan-owns-gathers). ``split``: the plan splits backwards, so
    hp_recompute's split ran them (hpr.stages.our-split); a plan of full backwards runs torch's own."""
    for rank, res in enumerate(results):
        assert bool(res["fsdp_split"]) == split, (rank, "the FSDP split path", res["fsdp_split"])
        for got, want in zip(res["losses"], res["ref_losses"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        for name, got in res["grads"].items():
            torch.testing.assert_close(got, res["ref_grads"][name], rtol=1e-5, atol=1e-7, msg=f"rank {rank} {name}")
        for fqn in res["checkpointed"]:  # the forward + one replay per microbatch
            assert res["calls"][fqn] == (2 if replayed else 1) * MICROBATCHES, (rank, fqn, res["calls"])
        assert res["replays"] == [len(res["checkpointed"]) * MICROBATCHES * replayed] * 2, (rank, res["replays"])
        assert res["live_sessions"] == 0
        assert res["sharded_at_end"] is True
        assert res["held_buffers"] == [], (rank, res["held_buffers"])
        if plan is not None:
            program = json.loads(plan.read_text())["ranks"][res["pp_rank"]]["actions"]
            for op in ("unshard", "reshard"):
                want = sum(res["fsdp_modules"][a["stage"]] for a in program if a["op"] == op)
                assert want > 0 and res["plan_calls"].get(op, 0) == want, (rank, op, want, res["plan_calls"])


@pytest.mark.parametrize("prefetch", ["jit", "bubble"])
@pytest.mark.parametrize("reshard", [True, False], ids=["reshard_after_forward", "keep_after_forward"])
def test_zbv_on_fsdp2_stages(tmp_path: Path, reshard: bool, prefetch: str) -> None:
    """Under jit the first stage's sessions replay inside its W (its I reads nothing), through
    hp_recompute's split driving FSDP2: still one replay per block and microbatch, and one
    all-gather per FSDP module and step, against torch's interleaved 1F1B's."""
    results = run_case(tmp_path, reshard, prefetch, baseline=prefetch == "bubble")
    if prefetch == "jit":
        actions = [a for r in json.loads((tmp_path / "plan.json").read_text())["ranks"] for a in r["actions"]]
        assert {a["stage"] for a in actions if a["op"] == "recompute" and a.get("in_backward")} == {0}
        assert not any(a.get("session") for a in actions if a["op"] == "backward_input" and a["stage"] == 0)
    check(results)
    check_collectives(results)


@pytest.mark.parametrize("schedule", ["zb-h1", "dualpipev", "interleaved-1f1b"])
@pytest.mark.parametrize("reshard", [True, False], ids=["reshard_after_forward", "keep_after_forward"])
def test_plans_gather_each_fsdp2_module_once_per_step(tmp_path: Path, schedule: str, reshard: bool) -> None:
    """ZB-H1 (one stage per rank, against torch's 1F1B), DualPipeV (a V) and an interleaved
    1F1B plan (torch's backwards, not split; against torch's interleaved 1F1B): exact
    gradients, and each FSDP module gathered once in the step."""
    results = run_case(tmp_path, reshard, "bubble", schedule=schedule, baseline=True)
    check(results, split=schedule != "interleaved-1f1b")
    check_collectives(results)


@pytest.mark.parametrize("schedule", ["zb-h1", "zbv"])
def test_a_step_input_that_requires_grad_gets_its_gradient(tmp_path: Path, schedule: str) -> None:
    """The first stage's I computes nothing (the plan names no session there); its W is the whole
    backward, as torch's is, so a step input that requires grad gets the gradient the unsharded
    model gives it, on every dp rank that feeds the first stage, through hp_recompute's split."""
    results = run_case(tmp_path, True, "jit", schedule=schedule, input_grad=True)
    check(results)
    fed = [res for res in results if "input_grad" in res]
    assert len(fed) == 2, [sorted(res) for res in results]  # pp rank 0 of each dp rank
    for res in fed:
        assert res["input_grad"] is not None
        torch.testing.assert_close(res["input_grad"], res["ref_input_grad"], rtol=1e-5, atol=1e-7)


def test_a_frozen_first_stage_under_zbv_with_fsdp2_a_selective_policy_and_autocast(tmp_path: Path) -> None:
    """The first stage frozen (requires_grad_(False)), so stage 1's input needs no gradient,
    on torchtitan's composition (selective wrappers, fully_shard, bf16 autocast, prefetched
    replays): every other weight gets the unsharded model's gradient (hpr.stages.frozen-inputs; stages
    split by hp_recompute find no input to differentiate and leave every weight to W)."""
    results = run_case(tmp_path, True, "bubble", selective=True, autocast=True, policy="selective", frozen=True)
    frozen = {"layers.0", "layers.1"}  # the first stage: no parameter and no input needs a gradient, so its
    for res in results:  # checkpoints save nothing and have nothing to replay (a forward each)
        assert all(res["calls"][fqn] == MICROBATCHES for fqn in frozen & set(res["checkpointed"])), res["calls"]
        res["checkpointed"] = sorted(set(res["checkpointed"]) - frozen)
    check(results)
    got = {name for res in results for name in res["grads"]}
    assert got == set(results[0]["ref_grads"]) and not any(n.startswith(("layers.0.", "layers.1.")) for n in got)


def test_zbv_on_hsdp_stages(tmp_path: Path) -> None:
    """PP 2 x HSDP (replicate 2 x shard 2): 8 processes; one all-gather, one reduce-scatter and
    one all-reduce per FSDP module and step, no more than torch's interleaved 1F1B."""
    results = run_case(tmp_path, True, "jit", dp=4, hsdp=True, baseline=True)
    check(results)
    check_collectives(results, hsdp=True)


def test_sharded_blocks_the_user_did_not_wrap(tmp_path: Path) -> None:
    """Plain blocks, ``fully_shard``-ed: PlannedSchedule checkpoints them inside FSDP's hooks
    and a prefetched replay gathers their parameters, as with the wrapper."""
    check(run_case(tmp_path, True, "bubble", unwrapped=True))


def test_zbv_on_fsdp2_stages_with_a_selective_policy_under_autocast(tmp_path: Path) -> None:
    """torchtitan's composition under PlannedSchedule: blocks wrapped with a selective policy
    (matmul outputs saved) under a plan that checkpoints them selectively, ``fully_shard``-ed,
    bfloat16 autocast, prefetched replays."""
    check(run_case(tmp_path, True, "bubble", selective=True, autocast=True, policy="selective"))


@pytest.mark.skipif(not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"),
                    reason="selective checkpointing needs torch >= 2.4")
def test_eval_on_fsdp2_stages_with_a_selective_policy_under_autocast(tmp_path: Path) -> None:
    """The same composition, then ``eval()`` under no_grad (torchtitan's validation): the
    plan's forward side alone (hpr.exec.forward-only) gives the training step's losses (no
    optimizer step between) and leaves the reduced gradients as they were."""
    results = run_case(tmp_path, True, "bubble", selective=True, autocast=True, policy="selective", eval=True)
    check(results)
    assert sum(len(res["eval_losses"]) for res in results) == 2 * MICROBATCHES  # the last stage, on each dp rank
    for rank, res in enumerate(results):
        for got, want in zip(res["eval_losses"], res["losses"]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert res["grads_changed_by_eval"] == [], (rank, res["grads_changed_by_eval"])
        assert res["sharded_after_eval"]


@pytest.mark.skipif(not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"),
                    reason="selective checkpointing needs torch >= 2.4")
def test_1f1b_replays_inside_the_backward_of_fsdp2_stages(tmp_path: Path) -> None:
    """1F1B reads each session in one backward, so the plan's jit replays are ``in_backward``:
    each block replays when FSDP2's backward reaches it, with its parameters gathered by FSDP's
    own pre-backward hook (``reshard_after_forward=True``), selectively, under bfloat16
    autocast: exact gradients, one replay per block and microbatch."""
    results = run_case(tmp_path, True, "jit", schedule="1f1b", selective=True, autocast=True, policy="selective")
    plan = json.loads((tmp_path / "plan.json").read_text())
    recomputes = [a for r in plan["ranks"] for a in r["actions"] if a["op"] == "recompute"]
    assert recomputes and all(a.get("in_backward") for a in recomputes)
    check(results, split=False)


@pytest.mark.skipif(not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"),
                    reason="selective checkpointing needs torch >= 2.4")
def test_1f1b_replays_in_pieces_on_fsdp2_stages(tmp_path: Path) -> None:
    """``--prefetch bubble`` on 1F1B, within 1.25 times jit's peak, prefetches a stage's last block
    into the wait before its backward (hpr.exec.replay-in-pieces), on
    ``fully_shard``-ed blocks (``reshard_after_forward=True``: each piece's replay gathers its
    block), selectively, under bfloat16 autocast: exact gradients, one replay per block and
    microbatch."""
    results = run_case(tmp_path, True, "bubble", schedule="1f1b", selective=True, autocast=True, policy="selective",
                       room=1.25)
    plan = json.loads((tmp_path / "plan.json").read_text())
    pieces = [a for r in plan["ranks"] for a in r["actions"] if a["op"] == "recompute" and "regions" in a]
    # A piece prefetched, the rest of its session inside the backward (within twice jit's peak
    # the whole replay now fits right after the backward before, which is done with its own).
    assert [a for a in pieces if not a.get("in_backward")] and [a for a in pieces if a.get("in_backward")], pieces
    check(results, split=False)


def test_wrapped_fsdp2_blocks_the_plan_does_not_checkpoint_run_plainly(tmp_path: Path) -> None:
    """torchtitan's order (every block checkpoint-wrapped, then ``fully_shard``-ed) under a plan
    that checkpoints none of them: the wrappers run their blocks plainly inside FSDP's hooks,
    no replay, exact gradients, nothing left gathered."""
    check(run_case(tmp_path, True, "bubble", policy=False), replayed=False)


@pytest.mark.skipif(not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"),
                    reason="selective checkpointing needs torch >= 2.4")
def test_a_selective_plan_on_plain_fsdp2_blocks_under_autocast(tmp_path: Path) -> None:
    """The plan, not the user, says selective: PlannedSchedule checkpoints plain
    ``fully_shard``-ed blocks with the selective policy inside FSDP's hooks, under bfloat16
    autocast, replays prefetched into bubbles (gathering their parameters)."""
    check(run_case(tmp_path, True, "bubble", unwrapped=True, autocast=True, policy="selective"))


@pytest.mark.parametrize("hsdp", [False, True], ids=["fsdp2", "hsdp"])
def test_a_plan_made_for_the_layout_gathers_and_frees_each_stage(tmp_path: Path, hsdp: bool) -> None:
    """``make_plan(dp_shard=2[, dp_replicate=2])`` puts an unshard before each stage's first
    user (prefetched replays included) and a reshard after its last: PlannedSchedule runs
    them as FSDP2's unshard()/reshard() (hpr.stages.plan-owns-gathers), with the gradients of the unsharded model."""
    results = run_case(tmp_path, True, "bubble", dp=4 if hsdp else 2, hsdp=hsdp, planned_layout=True)
    check(results, tmp_path / "plan.json")
    check_collectives(results, hsdp=hsdp)


@pytest.mark.skipif(not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"),
                    reason="selective checkpointing needs torch >= 2.4")
def test_a_plan_made_for_the_layout_on_torchtitans_composition(tmp_path: Path) -> None:
    """The layout plan's gathers, issued ahead and waited for by each stage's first reader
    (hpr.stages.plan-owns-gathers), on selective wrappers, ``fully_shard``, bf16 autocast and prefetched replays."""
    results = run_case(tmp_path, True, "bubble", selective=True, autocast=True, policy="selective",
                       planned_layout=True)
    check(results, tmp_path / "plan.json")
    check_collectives(results, hsdp=False)


@pytest.mark.skipif(not compile_split.SUPPORTED, reason=f"torch {torch.__version__} cannot split compiled "
                    f"backwards (hp_recompute.compile_split, torch >= 2.13)")
@pytest.mark.parametrize("backend,reshard,prefetch,planned_layout",
                         [("aot_eager", True, "bubble", True), ("aot_eager", False, "jit", False),
                          ("inductor", True, "bubble", True)],
                         ids=["aot_eager-layout-reshard_after_forward", "aot_eager-keep_after_forward-jit",
                              "inductor-layout-reshard_after_forward"])
def test_compiled_blocks_on_fsdp2_stages_under_zbv(tmp_path: Path, backend: str, reshard: bool, prefetch: str,
                                                   planned_layout: bool) -> None:
    """torchtitan's order (each block checkpoint-wrapped, ``compile(backend=...)``,
    ``fully_shard``-ed, then the stage; the wrapper compiles with ``compile_backend``): every
    I and W of a split stage runs its half of each compiled backward, the first stage's W the
    whole of it (hpr.stages.our-split), on parameters the plan keeps gathered (hpr.stages.plan-owns-gathers): exact
    gradients, one replay per block and microbatch, one all-gather and one reduce-scatter per
    FSDP module and step."""
    results = run_case(tmp_path, reshard, prefetch, planned_layout=planned_layout, compile=backend)
    check(results, tmp_path / "plan.json" if planned_layout else None)
    check_collectives(results)
    first = {f"layers.{i}" for i in range(LAYERS_PER_STAGE)}  # stage 0's blocks
    for rank, res in enumerate(results):
        blocks = set(res["checkpointed"])
        want = {"input": len(blocks - first) * MICROBATCHES, "weight": len(blocks - first) * MICROBATCHES,
                "whole": len(blocks & first) * MICROBATCHES}
        assert res["compiled_halves"] == {k: n for k, n in want.items() if n}, (rank, res["compiled_halves"])


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.skipif(not compile_split.SUPPORTED, reason=f"torch {torch.__version__} cannot split compiled "
                    f"backwards (hp_recompute.compile_split, torch >= 2.13)")
@pytest.mark.parametrize("schedule,dp,mixed", [("zbv", 2, False), ("dualpipev", 1, True)],
                         ids=["zbv-dp2", "dualpipev-dp1-some-full"])
def test_torchtitans_production_stack_under_zero_bubble_plans(tmp_path: Path, schedule: str, dp: int,
                                                              mixed: bool) -> None:
    """Issue 49's combination: every block wrapped with a selective policy, ``compile()``-d with
    inductor (the policy's matmuls kept dispatched, hpr.selective.visible-ops),
    ``fully_shard``-ed on a dp mesh of ``dp``, bf16 autocast, gradients accumulated over two
    steps (torchtitan's ``scale_grads=False``), under a plan of the schedule that checkpoints
    selectively (``mixed``: every other block in full, as ``--checkpoint auto`` may choose under a
    budget, its wrapper's policy set aside: hpr.selective.plan-full): every gradient within 2%
    (relative norm) of the unsharded eager model's and of torch's interleaved 1F1B on the same
    stack (its own wrapper compiled around its checkpoint), one replay per block and
    microbatch in each step, one all-gather and one reduce-scatter per FSDP module and step
    (dp 2), no more than torch's."""
    layers = LAYERS_PER_STAGE * STAGES[schedule]
    policy = ["selective", True] * (layers // 2) if mixed else "selective"
    results = run_case(tmp_path, True, "bubble", schedule=schedule, dp=dp, selective=True, autocast=True,
                       policy=policy, compile="inductor", accumulate=True, baseline=True)
    if dp > 1:  # FSDP on a mesh of one rank has nothing to gather or scatter
        check_collectives(results, exact=False)
    baseline = {name: g for res in results for name, g in res["baseline"]["grads"].items()}  # loops, not a V
    for rank, res in enumerate(results):
        assert res["replays"] == [len(res["checkpointed"]) * MICROBATCHES] * 2, (rank, res["replays"])
        assert res["live_sessions"] == 0 and res["sharded_at_end"] is True
        assert res["grads"].keys() <= baseline.keys()
        for name, got in res["grads"].items():
            for want in (res["ref_grads"][name], baseline[name]):
                assert _relative(got, want) < 0.02, (rank, name, _relative(got, want))
        for got, want in zip(res["losses"], res["ref_losses"]):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-3)
