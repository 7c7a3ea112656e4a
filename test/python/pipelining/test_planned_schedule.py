"""PlannedSchedule against torch's own schedules, on gloo with 2 and 4 CPU ranks.

For each schedule, every rank runs one step twice on the same stages: torch's schedule
class with ``torch.utils.checkpoint`` on every block, and ``PlannedSchedule`` with a plan
of *torch's own action order* (the schedule's ``pipeline_order`` dumped as CSV and
planned with hp-recompute-plan), or of our generator where torch has no CSV (1F1B).
Losses and gradients must match; each checkpointed block must run exactly twice per
microbatch (forward + one replay) under the plan, and replay exactly once per microbatch
also in the first step, where torch's stages infer their metadata.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

pipelining = pytest.importorskip("torch.distributed.pipelining", reason="needs torch.distributed.pipelining")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pp_plain_worker  # noqa: E402
import pp_titan_worker  # noqa: E402
import pp_worker  # noqa: E402
from hp_recompute import compile_split  # noqa: E402
from rank_processes import spawn_ranks  # noqa: E402

pytestmark = pytest.mark.slow  # starts rank processes or torchrun (test/python/conftest.py)

REPO = HERE.parents[2]
PLAN_TOOL = Path(os.environ.get("HPR_BUILD_DIR", REPO / "build")) / "bin" / "hp-recompute-plan"
DIM, LAYERS_PER_STAGE = 16, 2
needs_selective = pytest.mark.skipif(not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"),
                                     reason="selective checkpointing needs torch >= 2.4")


def model_json(path: Path, layers: int, policy: Any = True) -> None:
    """Uniform blocks layers.0 .. checkpointed as ``policy`` (true, "selective"; or a list, block
    by block) and a head, with made-up but consistent costs."""
    def region(name: str, policy: Any) -> Dict[str, Any]:
        return {"name": name, "checkpoint": policy, "checkpointable": name != "head",
                "fwd_flops": 1e5, "fwd_time_us": 0, "saved_bytes": 4096, "input_bytes": 512, "param_bytes": 4352,
                **({"selective_replay_time_us": 0.1} if policy == "selective" else {})}
    policies = policy if isinstance(policy, list) else [policy] * layers
    regions = [region(f"layers.{i}", policies[i]) for i in range(layers)] + [region("head", False)]
    path.write_text(json.dumps({"format": "hp-recompute-model", "version": 1, "name": "pp-test", "regions": regions}))


def stage_spec(stages: int, per: int = LAYERS_PER_STAGE) -> str:
    parts = [f"{s}:{s * per}-{(s + 1) * per - 1}" for s in range(stages)]
    parts[-1] = f"{stages - 1}:{(stages - 1) * per}-{stages * per}"  # the head (last region) too
    return ",".join(parts)


def run_case(tmp: Path, torch_schedule: str, ranks: int, stages: int, microbatches: int, emit: str = "json",
             prefetch: str = "jit", dropout: float = 0.0, planned_wrap: Any = None, per: int = LAYERS_PER_STAGE,
             worker: Any = pp_worker.main, policy: Any = True, room: float = 0, **extra: Any) -> List[Dict[str, Any]]:
    """Plans and runs one case; ``room`` > 0: ``--memory-budget`` that many times jit's activation peak, on
    ``--schedule-gen torch_schedule`` (the reference still runs torch's schedule)."""
    assert PLAN_TOOL.exists(), f"build the project first: {PLAN_TOOL} is missing"
    layers = per * stages
    model_json(tmp / "model.json", layers, policy)
    plan = tmp / ("plan.json" if emit == "json" else "plan.csv")
    if torch_schedule == "1f1b" or room:  # a budget is priced on our generator's order, before torch's is dumped
        source = ["--schedule-gen", torch_schedule, "--ranks", str(ranks), "--microbatches", str(microbatches)]
        dump = None
    else:
        dump = str(tmp / "torch_order.csv")
        source = ["--schedule", dump]
    cmd = [str(PLAN_TOOL), *source, "--model", str(tmp / "model.json"), "--stages", stage_spec(stages, per),
           "--checkpoint", "model", "--prefetch", prefetch, "--emit", emit, "-o", str(plan)]
    if room:
        jit = subprocess.run([*cmd[:cmd.index("--prefetch")], "--emit", "json"], capture_output=True, text=True,
                             check=True)
        cmd += ["--memory-budget", str(int(room * max(json.loads(jit.stdout)["summary"]["peak_bytes"])))]
    out = tmp / "out"
    out.mkdir()
    cfg = {"python": str(REPO / "python"), "store": str(tmp / "store"), "ranks": ranks, "stages": stages,
           "layers": layers, "dim": DIM, "batch": 2 * microbatches, "microbatches": microbatches,
           "dropout": dropout, "torch_schedule": torch_schedule, "dump_csv": dump, "plan_cmd": cmd,
           "plan": str(plan), "out": str(out), "planned_wrap": planned_wrap, **extra}
    return spawn_ranks(worker, cfg, ranks)


def check(results: List[Dict[str, Any]], microbatches: int) -> None:
    for rank, res in enumerate(results):
        assert len(res["plan_losses"]) == len(res["ref_losses"])
        for got, want in zip(res["plan_losses"], res["ref_losses"]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        assert res["plan_grads"].keys() == res["ref_grads"].keys()
        for name, want in res["ref_grads"].items():
            torch.testing.assert_close(res["plan_grads"][name], want, rtol=1e-5, atol=1e-7, msg=name)
        for fqn in res["checkpointed"]:  # forward + exactly one replay per microbatch
            assert res["plan_calls"][fqn] == 2 * microbatches, (rank, fqn, res["plan_calls"])
            assert res["ref_calls"][fqn] >= 2 * microbatches
        # Also on the first step, where torch's stages infer their metadata (hpr.stages.plain-inference):
        # one replay per checkpointed block per microbatch, none for the inference.
        assert res["plan_replays"] == [len(res["checkpointed"]) * microbatches] * 2, (rank, res["plan_replays"])
        # hpr.stages.step-buffers: no receive buffer or handed-over tensor outlives a step, and
        # reading one then is torch's error, not the last step's data.
        assert res["held_buffers"] == [], (rank, res["held_buffers"])
        assert set(res["stale_reads"]) <= {"PipeliningMetadataError"}, (rank, res["stale_reads"])


CASES = [
    # torch schedule, ranks, stages, microbatches
    ("zbv", 2, 4, 4),
    ("izb", 2, 4, 4),
    ("1f1b", 2, 2, 4),
    ("zbv", 4, 8, 8),
]
if getattr(pipelining.schedules, "ScheduleDualPipeV", None) is not None:
    CASES.append(("dpv", 2, 4, 4))


@pytest.mark.parametrize("torch_schedule,ranks,stages,microbatches", CASES,
                         ids=[f"{c[0]}-{c[1]}ranks" for c in CASES])
def test_planned_schedule_matches_torch(tmp_path: Path, torch_schedule: str, ranks: int, stages: int,
                                        microbatches: int) -> None:
    results = run_case(tmp_path, torch_schedule, ranks, stages, microbatches)
    check(results, microbatches)
    if torch_schedule in ("zbv", "izb"):
        # torch replays a block once per backward call, so the stages with a dx/dw split call it more often.
        assert any(res["ref_calls"][f] > 2 * microbatches for res in results for f in res["checkpointed"])


def test_a_zbv_plan_that_replays_sessions_again_for_their_dw_matches_torch(tmp_path: Path) -> None:
    """hpr.exec.replay-for-weight under torch's stages: at half of jit's peak the planner drops sessions' replays
    after their dx and replays them for their dw; losses and gradients are torch's ZBV's, and each such block
    runs once more per dropped session."""
    results = run_case(tmp_path, "zbv", 2, 4, 4, room=0.5)
    plan = json.loads((tmp_path / "plan.json").read_text())
    again = [a for r in plan["ranks"] for a in r["actions"] if a.get("for_weight")]
    assert again, "the budget makes the planner replay some sessions for their dw"
    for rank, res in enumerate(results):
        mine = sum(1 for a in plan["ranks"][rank]["actions"] if a.get("for_weight"))
        for got, want in zip(res["plan_losses"], res["ref_losses"]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        for name, want in res["ref_grads"].items():
            torch.testing.assert_close(res["plan_grads"][name], want, rtol=1e-5, atol=1e-7, msg=name)
        per_session = len(res["checkpointed"]) // 2  # each rank holds 2 of ZBV's 4 stages, alike
        assert res["plan_replays"] == [len(res["checkpointed"]) * 4 + per_session * mine] * 2, (rank, res)


def test_plans_keep_what_the_plain_model_computes(tmp_path: Path) -> None:
    """Four things a plan must keep of the model it runs, each against the model run plainly
    on the same microbatches, on 2 ranks (pp_plain_worker.py):

    * a block called with keywords named like checkpoint options (``debug=True``,
      ``early_stop=True``, ``use_reentrant=True``) gets them: the user wrote no checkpoint
      call (before, the checkpoint ate them: other losses, or a TypeError);
    * buffers a block updates in forward (a call counter, BatchNorm statistics) are updated
      once per microbatch, over two steps (before: again by every replay and by the metadata
      inference);
    * two schedules over the same stages, a checkpoint-all plan A and a plan B checkpointing
      nothing, stepped A, B, A: every step replays what its own plan says (before, building B
      re-planned A: A's second step replayed nothing);
    * the first stage frozen, under ZBV and ZB-H1: every other weight gets the plain model's
      gradient (before, the next stage's stayed None: torch's I had no input to differentiate);
      under ZBV also the first two stages frozen: stage 2 hands stage 1, on its rank, no input
      gradient, and stage 1 has no buffer for one (hpr.stages.step-buffers drops and allocates
      only the buffers torch's stage metadata gives).
    """
    layers, microbatches = 8, 4
    model_json(tmp_path / "model.json", layers)
    plans = {}
    for name, gen, stages, checkpoint in (("zbv", "zbv", 4, "model"), ("zbv_none", "zbv", 4, "none"),
                                          ("zb-h1", "zb-h1", 2, "model")):
        plans[name] = str(tmp_path / f"{name}.json")
        subprocess.run([str(PLAN_TOOL), "--schedule-gen", gen, "--ranks", "2", "--microbatches", str(microbatches),
                        "--model", str(tmp_path / "model.json"), "--stages", stage_spec(stages, layers // stages),
                        "--checkpoint", checkpoint, "--emit", "json", "-o", plans[name]], check=True)
    (tmp_path / "out").mkdir()
    cfg = {"python": str(REPO / "python"), "store": str(tmp_path / "store"), "layers": layers, "dim": DIM,
           "batch": 2 * microbatches, "microbatches": microbatches, "plans": plans, "out": str(tmp_path / "out")}
    results = spawn_ranks(pp_plain_worker.main, cfg, 2)
    blocks_per_rank = layers // 2  # checkpointed blocks on each rank, under both plans
    for case in ("keywords", "buffers", "two_plans", "frozen_zbv", "frozen_zb-h1", "frozen_two_zbv"):
        want = results[0][case]["plain"]
        losses = [loss for res in results for loss in res[case]["plan"]["losses"]]
        assert len(losses) == microbatches, case
        for got, expected in zip(losses, want["losses"]):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7, msg=case)
        grads = {n: g for res in results for n, g in res[case]["plan"]["grads"].items()}
        assert grads.keys() == want["grads"].keys(), case
        for name, grad in grads.items():
            assert grad is not None, (case, name)
            torch.testing.assert_close(grad, want["grads"][name], rtol=1e-5, atol=1e-7, msg=f"{case}: {name}")
        buffers = {n: b for res in results for n, b in res[case]["plan"]["buffers"].items()}
        assert buffers.keys() == {n for n in want["buffers"]}, case
        for name, buffer in buffers.items():
            torch.testing.assert_close(buffer, want["buffers"][name], rtol=1e-6, atol=1e-7, msg=f"{case}: {name}")
    assert all(b.item() == 2 * microbatches for n, b in results[0]["buffers"]["plain"]["buffers"].items()
               if n.endswith(".calls"))
    for res in results:
        assert res["two_plans"]["plan"]["replays"] == [blocks_per_rank * microbatches, 0,
                                                       blocks_per_rank * microbatches]
        assert res["buffers"]["plan"]["replays"] == [blocks_per_rank * microbatches] * 2


@pytest.mark.parametrize("torch_schedule,ranks,stages,microbatches", [("zbv", 2, 4, 4), ("1f1b", 2, 2, 4)])
def test_eval_runs_the_plans_forwards_only(tmp_path: Path, torch_schedule: str, ranks: int, stages: int,
                                           microbatches: int) -> None:
    """``eval()`` (torchtitan's validation, under no_grad and not) runs the plan's forward side
    alone (hpr.exec.forward-only): the training step's losses (no optimizer step
    between), gradients untouched (no backward, no reduce_grad). Before, a zero-bubble plan's
    eval ran its backward_input and failed on one rank while the other waited."""
    results = run_case(tmp_path, torch_schedule, ranks, stages, microbatches, eval=True)
    check(results, microbatches)
    assert sum(len(res["plan_losses"]) for res in results) == microbatches
    for res in results:
        for mode in ("no_grad", "grad"):
            assert len(res[f"eval_{mode}_losses"]) == len(res["plan_losses"])
            for got, want in zip(res[f"eval_{mode}_losses"], res["plan_losses"]):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        for name, grad in res["plan_grads"].items():
            assert torch.equal(res["grads_after_eval"][name], grad), name


def test_a_1f1b_plan_that_replays_in_pieces_matches_torch(tmp_path: Path) -> None:
    """``--prefetch bubble`` on 1F1B, within 1.25 times jit's peak, prefetches a stage's last block
    into the wait before its backward (a replay in pieces, hpr.exec.replay-in-pieces): torch's
    stages run it with exact gradients and one replay per block and microbatch."""
    results = run_case(tmp_path, "1f1b", 2, 2, 4, prefetch="bubble", dropout=0.1, room=1.25)
    raw = json.loads((tmp_path / "plan.json").read_text())
    pieces = [a for r in raw["ranks"] for a in r["actions"] if a["op"] == "recompute" and "regions" in a]
    # A piece prefetched, the rest of its session inside the backward (within twice jit's peak
    # the whole replay now fits right after the backward before, which is done with its own).
    assert [a for a in pieces if not a.get("in_backward")] and [a for a in pieces if a.get("in_backward")], pieces
    check(results, 4)


@pytest.mark.parametrize("wrap", ["full", "selective"])
def test_blocks_the_user_wrapped_with_our_checkpoint_wrapper_run_as_planned(tmp_path: Path, wrap: str) -> None:
    """torchtitan wraps its blocks before building stages; with ``hp_recompute.checkpoint_wrapper``
    (its options, a selective policy's ``context_fn`` too, kept by torch's wrapper as a
    ``functools.partial``) PlannedSchedule uses the wrapper as it is: exact gradients, one
    replay per block and microbatch, prefetched into the bubble."""
    results = run_case(tmp_path, "zbv", 2, 4, 4, prefetch="bubble", dropout=0.1, planned_wrap=wrap,
                       policy="selective" if wrap == "selective" else True)
    check(results, 4)
    # The policy is applied in the plan's replays: matmul outputs were saved, so no replay runs a matmul.
    replayed = [res["replay_matmuls"] for res in results]
    assert all(f == 0 for f in replayed) if wrap == "selective" else all(f > 0 for f in replayed), replayed


@needs_selective
def test_a_plan_that_checkpoints_selectively_applies_the_policy_to_plain_blocks(tmp_path: Path) -> None:
    """NOTE [ Selective policy ]: the plan says "selective", the blocks are plain modules;
    PlannedSchedule checkpoints them with the selective policy's context_fn: exact gradients,
    one replay per block and microbatch (prefetched), and no replay runs a matmul."""
    results = run_case(tmp_path, "zbv", 2, 4, 4, prefetch="bubble", dropout=0.1, policy="selective",
                       count_replay_matmuls=True)
    check(results, 4)
    assert all(res["replay_matmuls"] == 0 for res in results), [res["replay_matmuls"] for res in results]


@needs_selective
def test_a_selective_plan_refuses_a_wrapper_without_a_policy() -> None:
    """A block the user wrapped without ``context_fn`` would replay every op and keep less than
    the plan prices; one wrapped with a policy keeps it."""
    from hp_recompute import checkpoint_wrapper
    from hp_recompute.pipelining.regions import checkpoint_regions
    from hp_recompute.errors import RunError
    from hp_recompute.selective import selective_context_fn

    module = torch.nn.Module()
    module.layers = torch.nn.ModuleDict({"0": checkpoint_wrapper(torch.nn.Linear(4, 4)),
                                         "1": checkpoint_wrapper(torch.nn.Linear(4, 4),
                                                                 context_fn=selective_context_fn())})
    with pytest.raises(RunError) as error:
        checkpoint_regions(module, ["layers.0"], 3, selective=["layers.0"])
    assert str(error.value) == (
        "hp_recompute.pipelining: stage 3: the plan checkpoints region 'layers.0' \"selective\", but its "
        "checkpoint_wrapper has no context_fn, so it would replay every op; unwrap it (the plan checkpoints it) or "
        "pass the policy: checkpoint_wrapper(block, context_fn=hp_recompute.selective_context_fn())")
    assert checkpoint_regions(module, ["layers.1"], 3, selective=["layers.1"]) == ["layers.1"]
    assert "forward" in module.layers["1"].__dict__  # the wrapper, run as the plan says


def test_blocks_wrapped_where_the_plan_does_not_checkpoint_run_plainly(tmp_path: Path) -> None:
    """torchtitan wraps every block; a plan that checkpoints none of them (auto's choice, or
    --checkpoint none) is the program: the wrappers run their blocks plainly, no replay the
    plan did not place (torch's wrapper would replay in each of I and W), the same losses and
    gradients as torch's schedule with checkpointing."""
    microbatches = 4
    results = run_case(tmp_path, "zbv", 2, 4, microbatches, planned_wrap="full", policy=False)
    for rank, res in enumerate(results):
        for got, want in zip(res["plan_losses"], res["ref_losses"]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        for name, want in res["ref_grads"].items():
            torch.testing.assert_close(res["plan_grads"][name], want, rtol=1e-5, atol=1e-7, msg=name)
        assert res["plan_replays"] == [0, 0], (rank, res["plan_replays"])
        assert res["checkpointed"] and all(res["plan_calls"][fqn] == microbatches for fqn in res["checkpointed"]), \
            (rank, res["plan_calls"])


@needs_selective
def test_torchtitans_ac_converted_runs_as_the_plan_says() -> None:
    """torchtitan applies torch's checkpoint_wrapper (full, or selective with a context_fn);
    ``convert_checkpoint_wrappers`` makes each one ours in place (same names, same options),
    after which the plan's regions accept it and a wrapper the plan does not checkpoint
    runs plainly; what cannot be converted is refused, naming the module, converting none."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as torch_wrapper

    import hp_recompute as hr
    from hp_recompute.pipelining.regions import checkpoint_regions
    from hp_recompute.wrapper import CheckpointWrapper

    def policy():
        return torch.utils.checkpoint.create_selective_checkpoint_contexts(
            lambda ctx, op, *a, **k: torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE)

    module = torch.nn.Module()
    module.layers = torch.nn.ModuleDict({"0": torch_wrapper(torch.nn.Linear(4, 4), preserve_rng_state=False),
                                         "1": torch_wrapper(torch.nn.Linear(4, 4), context_fn=policy),
                                         "2": hr.checkpoint_wrapper(torch.nn.Linear(4, 4))})
    names = [n for n, _ in module.named_parameters()]
    assert hr.convert_checkpoint_wrappers(module) == ["layers.0", "layers.1"]
    assert [n for n, _ in module.named_parameters()] == names
    for key, options in (("0", {"preserve_rng_state": False}), ("1", {"context_fn": policy})):
        wrapper = module.layers[key]
        assert type(wrapper) is CheckpointWrapper
        assert wrapper.checkpoint_fn.func is hr.checkpoint and wrapper.checkpoint_fn.keywords == options
    x = torch.randn(2, 4, requires_grad=True)
    with hr.recompute_handle_collector_ctx() as handles:
        module.layers["0"](x)
    assert len(handles) == 1  # our checkpoint: a handle the plan replays
    assert checkpoint_regions(module, ["layers.1"], 0, selective=["layers.1"]) == ["layers.1"]
    assert "forward" in module.layers["0"].__dict__  # not planned: runs its Linear plainly

    reentrant = torch.nn.Sequential(torch.nn.Linear(4, 4), torch_wrapper(torch.nn.Linear(4, 4),
                                                                         checkpoint_impl=CheckpointImpl.REENTRANT))
    with pytest.raises(hr.CheckpointError, match=r"module '1' is torch's reentrant checkpoint"):
        hr.convert_checkpoint_wrappers(reentrant)
    if hasattr(torch, "compile"):
        compiled = torch.nn.Sequential(torch_wrapper(torch.nn.Linear(4, 4)), torch_wrapper(torch.nn.Linear(4, 4)))
        compiled[1].compile()
        with pytest.raises(hr.CheckpointError, match=r"module '1' is compiled around its checkpoint already"):
            hr.convert_checkpoint_wrappers(compiled)
        assert type(compiled[0]) is not CheckpointWrapper  # nothing converted


def test_wrappers_must_agree_with_the_plan() -> None:
    """torch's wrapper where the plan places no replay is refused; a module an earlier plan
    checkpointed gets its own forward back under a plan that does not."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as torch_wrapper

    from hp_recompute.pipelining.regions import checkpoint_regions
    from hp_recompute.errors import RunError

    module = torch.nn.Module()
    module.layers = torch.nn.ModuleDict({"0": torch.nn.Linear(4, 4), "1": torch_wrapper(torch.nn.Linear(4, 4))})
    with pytest.raises(RunError) as error:
        checkpoint_regions(module, ["layers.0"], 2)
    assert str(error.value) == (
        "hp_recompute.pipelining: stage 2: module 'layers.1' is wrapped by torch's checkpoint, but the plan does not "
        "checkpoint it, so it would replay where the plan placed no replay; unwrap it, or convert it with "
        "hp_recompute.convert_checkpoint_wrappers(model) (ours run as the plan says)")
    module.layers["1"] = torch.nn.Linear(4, 4)
    assert checkpoint_regions(module, ["layers.0"], 2) == ["layers.0"]
    assert "forward" in module.layers["0"].__dict__
    assert checkpoint_regions(module, ["layers.1"], 2) == ["layers.1"]
    assert "forward" not in module.layers["0"].__dict__  # its own forward again


@needs_selective
@pytest.mark.skipif(not compile_split.SUPPORTED, reason="the compiled dx/dw split needs torch >= 2.13")
def test_a_compiled_module_the_selective_policy_cannot_see_is_refused() -> None:
    """A selective region with a module compiled where the policy cannot see its ops (inductor,
    but where a selective wrapper's ``compile()`` kept the ops its policy saves dispatched) would
    replay every matmul (hpr.selective.visible-ops): refused before anything runs. (A full
    region's selective wrapper: test_eager_compile.py, hpr.selective.plan-full.)"""
    from hp_recompute import checkpoint_wrapper
    from hp_recompute.pipelining.regions import checkpoint_regions
    from hp_recompute.errors import RunError
    from hp_recompute.selective import selective_context_fn

    module = torch.nn.Module()
    module.layers = torch.nn.ModuleDict({"0": checkpoint_wrapper(torch.nn.Linear(4, 4),
                                                                 context_fn=selective_context_fn())})
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    block[2].compile()  # a compiled child of a plain block
    module.layers["1"] = block
    with pytest.raises(RunError) as error:
        checkpoint_regions(module, ["layers.1"], 1, selective=["layers.1"])
    assert str(error.value) == (
        "hp_recompute.pipelining: stage 1: the plan checkpoints region 'layers.1' \"selective\", but 'layers.1.2' is "
        "compiled where the policy cannot see its ops, so the replay would recompute every matmul; compile the "
        "block as checkpoint_wrapper(block, context_fn=hp_recompute.selective_context_fn()).compile() (inductor "
        "then keeps the ops the policy saves dispatched), or plan the region in full [hpr.selective.visible-ops]")
    module.layers["0"].compile(backend="aot_eager")  # the wrapper's compile marks what it compiled
    assert checkpoint_regions(module, ["layers.0"], 1, selective=["layers.0"]) == ["layers.0"]
    module.layers["1"] = checkpoint_wrapper(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()),
                                            context_fn=selective_context_fn())
    module.layers["1"].compile()  # inductor, keeping the policy's ops dispatched
    assert checkpoint_regions(module, ["layers.1"], 1, selective=["layers.1"]) == ["layers.1"]


@needs_selective
def test_replays_keep_buffers_in_the_mode_they_run_in() -> None:
    """A planned region's replays restore the buffers its forward changes in *that* mode: an
    eval forward (validation with grad on) changes no BatchNorm statistic, a training one does;
    the training replay must not count its batch twice (as the plain module counts it once)."""
    from hp_recompute.pipelining.regions import checkpoint_regions

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.layers = torch.nn.ModuleDict({"0": torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))})
    plain = copy.deepcopy(module)
    checkpoint_regions(module, ["layers.0"], 0)
    x = torch.randn(8, 4)
    for m in (module, plain):
        for training in (False, True):
            m.train(training)
            m.layers["0"](x).square().sum().backward()  # outside any session: one replay each (torch's rule)
    norm, want = module.layers["0"][1], plain.layers["0"][1]
    assert norm.num_batches_tracked.item() == want.num_batches_tracked.item() == 1
    torch.testing.assert_close(norm.running_mean, want.running_mean)
    torch.testing.assert_close(norm.running_var, want.running_var)


def test_stages_reused_by_another_plan_take_its_policy() -> None:
    """A second schedule over the same stage modules checkpoints each region as its own plan
    says, not as the first one did."""
    from hp_recompute.pipelining.regions import checkpoint_regions

    module = torch.nn.Module()
    module.layers = torch.nn.ModuleDict({"0": torch.nn.Linear(4, 4)})
    assert checkpoint_regions(module, ["layers.0"], 0) == ["layers.0"]
    assert module.layers["0"].forward.context_fn is None  # full: no context_fn
    assert checkpoint_regions(module, ["layers.0"], 0, selective=["layers.0"]) == []
    assert module.layers["0"].forward.context_fn is not None  # selective
    checkpoint_regions(module, ["layers.0"], 0)
    assert module.layers["0"].forward.context_fn is None


@pytest.mark.skipif(not compile_split.SUPPORTED, reason=f"torch {torch.__version__} cannot split compiled "
                    f"backwards (hp_recompute.compile_split, torch >= 2.13)")
def test_blocks_compiled_with_the_split_backend_run_a_zbv_plan(tmp_path: Path) -> None:
    """torch's own ZBV refuses compiled stages; with each block's layers compiled in place by
    ``compile_backend("aot_eager")`` (docs/compile-split.md) and the block wrapped, PlannedSchedule's
    I and W run the two halves of the compiled backward: gradients of torch's checkpointed
    eager ZBV, one replay per block and microbatch, prefetched into the bubble."""
    results = run_case(tmp_path, "zbv", 2, 4, 4, prefetch="bubble", planned_wrap="compiled")
    check(results, 4)


COMPILED_CASES = [("zbv", "aot_eager", True), ("zbv", "inductor", True), ("izb", "aot_eager", True),
                  ("zbv", "aot_eager", "selective"), ("zbv", "inductor", "selective")]
if getattr(pipelining.schedules, "ScheduleDualPipeV", None) is not None:
    COMPILED_CASES.append(("dpv", "aot_eager", True))


@pytest.mark.skipif(not compile_split.SUPPORTED, reason=f"torch {torch.__version__} cannot split compiled "
                    f"backwards (hp_recompute.compile_split, torch >= 2.13)")
@pytest.mark.parametrize("torch_schedule,backend,policy", COMPILED_CASES,
                         ids=[f"{s}-{b}" + ("-selective" if p == "selective" else "") for s, b, p in COMPILED_CASES])
def test_a_torchtitan_model_with_block_compile_runs_a_zero_bubble_plan(tmp_path: Path, torch_schedule: str,
                                                                       backend: str, policy: Any) -> None:
    """Issue 28's bar: a held-out torchtitan-style Llama (RMSNorm, rotary embeddings, SDPA,
    SwiGLU; ``layers`` a ModuleDict), each block wrapped with our ``checkpoint_wrapper`` and
    then ``block.compile(backend=..., fullgraph=True)`` (torchtitan's order, nothing else
    set), runs a plan of torch's zero-bubble order on 2 ranks: gradients of torch's eager
    schedule with checkpointing, one replay per block and microbatch, and the matmul work
    of the plan's I, W (and B) actions, replays apart, within 5% of one plain backward of
    the same compiled stages. torch's own schedule refuses those stages (recorded).

    Selective (a plan that says so, blocks wrapped with ``selective_context_fn()``, compiled with
    aot_eager, or inductor keeping the saved matmuls dispatched: hpr.selective.visible-ops): the
    compiled replays run no matmul, where full replays run them."""
    microbatches = 4
    results = run_case(tmp_path, torch_schedule, 2, 4, microbatches, prefetch="bubble", per=1,
                       worker=pp_titan_worker.main, backend=backend, policy=policy,
                       selective=policy == "selective")
    tol = {"aot_eager": 1e-5, "inductor": 1e-4}[backend]
    for rank, res in enumerate(results):
        for got, want in zip(res["plan_losses"], res["ref_losses"]):
            torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        assert res["plan_grads"].keys() == res["ref_grads"].keys()
        for name, want in res["ref_grads"].items():
            torch.testing.assert_close(res["plan_grads"][name], want, rtol=tol, atol=tol, msg=name)
        assert res["plan_replays"] == [res["blocks"] * microbatches] * 3, (rank, res["plan_replays"])
        flops, one = res["flops"], res["one_backward"]
        i = sum(n for k, n in flops.items() if k.startswith("backward_input"))
        w = sum(n for k, n in flops.items() if k.startswith("backward_weight"))
        b = flops.get("backward", 0)  # DualPipeV runs some microbatches' backward whole
        print(f"\n{torch_schedule} {backend} {policy} rank {rank}: matmul FLOPs I {i} + W {w} + B {b} = {i + w + b}; "
              f"one backward {one} ({(i + w + b) / one:.3f}x); by action {flops}; matmuls in replays "
              f"{res['replay_matmuls']}; torch's schedule on compiled stages: {res['torch_on_compiled']}")
        assert w > 0 and one > 0
        assert abs(i + w + b - one) <= 0.05 * one, (rank, flops, one)
        assert flops.get("replay", 0) > 0  # the replays ran, and apart from I and W
        if backend == "aot_eager" or policy == "selective":  # its ops reach the counter (inductor's out= kernels
            # do not, but for the ops a policy saves)
            assert (res["replay_matmuls"] == 0) == (policy == "selective"), (rank, res["replay_matmuls"])
        assert "not supported with stage modules that have used torch.compile" in res["torch_on_compiled"]


def test_planned_schedule_from_torch_csv_with_bubble_prefetch_and_dropout(tmp_path: Path) -> None:
    results = run_case(tmp_path, "zbv", 2, 4, 4, emit="torch-csv", prefetch="bubble", dropout=0.1)
    check(results, 4)
    # Round trip: torch's own loader reads the CSV back cell for cell, and torch's runtime
    # executes it (with torch.utils.checkpoint) to the same losses and gradients.
    rows = (tmp_path / "plan.csv").read_text().splitlines()
    for rank, res in enumerate(results):
        assert res["rt_row"] == rows[rank].split(",")
        for got, want in zip(res["rt_losses"], res["ref_losses"]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        for name, want in res["ref_grads"].items():
            torch.testing.assert_close(res["rt_grads"][name], want, rtol=1e-5, atol=1e-7, msg=name)


def reduce_grad_before_last_w(csv_path: Path, out: Path) -> None:
    """Writes OUT (and its sidecar): CSV_PATH with rank 0's first REDUCE_GRAD moved before its stage's last W.

    The sidecar's inserts keep their places between the cells (torch's runtime would run the
    CSV; the admission check must refuse it: the reduction would scale gradients that the
    moved-over W still adds to).
    """
    rows = [line.split(",") for line in csv_path.read_text().splitlines()]
    side = json.loads(sidecar_of(csv_path).read_text())
    row = rows[0]
    g = next(i for i, cell in enumerate(row) if cell.endswith("REDUCE_GRAD"))
    stage = row[g][:-len("REDUCE_GRAD")]
    w = max(i for i in range(g) if re.fullmatch(rf"{stage}W\d+", row[i]))
    row.insert(w, row.pop(g))
    for item in side["ranks"][0]["inserts"]:
        if w < item["before"] <= g:
            item["before"] += 1
    side["csv"] = out.name
    out.write_text("".join(",".join(r) + "\n" for r in rows))
    sidecar_of(out).write_text(json.dumps(side))


def sidecar_of(csv_path: Path) -> Path:
    return csv_path.with_suffix(".hpr.json")


def test_stages_that_do_not_match_the_plan_are_refused(tmp_path: Path) -> None:
    ranks, stages, microbatches = 2, 4, 4
    layers = LAYERS_PER_STAGE * stages
    model_json(tmp_path / "model.json", layers)
    plan = tmp_path / "plan.json"
    for emit, out in (("json", plan), ("torch-csv", tmp_path / "plan.csv")):
        subprocess.run([str(PLAN_TOOL), "--schedule-gen", "zbv", "--ranks", str(ranks), "--microbatches",
                        str(microbatches), "--model", str(tmp_path / "model.json"), "--stages", stage_spec(stages),
                        "--emit", emit, "-o", str(out)], check=True)
    reduce_grad_before_last_w(tmp_path / "plan.csv", tmp_path / "bad.csv")
    (tmp_path / "out").mkdir()
    cfg = {"python": str(REPO / "python"), "store": str(tmp_path / "store"), "ranks": ranks, "stages": stages,
           "layers": layers, "dim": DIM, "microbatches": microbatches, "torch_schedule": "zbv", "plan": str(plan),
           "good_csv": str(tmp_path / "plan.csv"), "bad_csv": str(tmp_path / "bad.csv"),
           "out": str(tmp_path / "out")}
    for rank, got in enumerate(spawn_ranks(pp_worker.refusals, cfg, ranks)):
        assert got["good"] == "accepted", got
        assert "the plan has 4 microbatches, n_microbatches is 5" in got["microbatches"]
        assert "the plan checkpoints region 'layers." in got["missing region"]
        assert "has no submodule of that name" in got["missing region"]
        assert "is already wrapped by torch's checkpoint" in got["torch-wrapped region"]
        if hasattr(torch, "compile"):
            for case, how in (("torch.compile(region)", "torch.compile(Block) registered in its place"),
                              ("region.compile()", "compiled in place by .compile()")):
                assert f"is {how}, so its compiled call would trace the plan's checkpoint" in got[case], got[case]
                assert "wrap the block with hp_recompute.checkpoint_wrapper, then call .compile() on the wrapper" \
                    in got[case], got[case]
        assert f"rank {rank} runs stages" in got["stages of another rank"]
        if rank == 1:
            assert re.search(r"stage \d's module holds layers\.99, which the plan does not place in that stage "
                             r"\(its regions: layers\.\d, layers\.\d\)", got["unplanned block on rank 1"]), got
        else:  # refused too, before anything runs: it would have waited for rank 1
            assert got["unplanned block on rank 1"].startswith(
                "RunError: hp_recompute.pipelining: rank 0 does not run: pipeline rank 1 refused the plan and its "
                "stages (RunError: hp_recompute.pipelining: "), got
        assert (f"stage {rank} was built with dw_builder, so torch runs its whole backward in "
                f"backward_input") in got["dw_builder"], got["dw_builder"]
        assert "build the stage without dw_builder" in got["dw_builder"]
        # Issue 24 item 5: refused on every rank before any step, naming the cell and the rule.
        assert got["good_csv"] == "accepted", got
        assert f"RunError: hp_recompute: plan {tmp_path / 'bad.csv'} is refused before any rank runs" \
            in got["bad_csv"], got
        assert f"{tmp_path / 'bad.csv'}:1:" in got["bad_csv"] and "REDUCE_GRAD')" in got["bad_csv"]
        assert "gradients are reduced once per stage, after its last W and B" in got["bad_csv"]


@pytest.mark.parametrize("damage,message", [
    (lambda side: side["ranks"][0].pop("cells"), "/ranks/0: missing required key 'cells'"),
    (lambda side: side["ranks"][1]["inserts"][0].pop("before"), "/ranks/1/inserts/0: missing required key 'before'"),
    (lambda side: side["ranks"].__setitem__(0, 7), "/ranks/0: expected an object with cells, and inserts"),
    (lambda side: side["ranks"][0].__setitem__("cells", 3), "cells, but the sidecar"),
])
def test_a_damaged_sidecar_is_refused_naming_the_entry(tmp_path: Path, damage, message) -> None:
    from hp_recompute.pipelining import load_torch_csv
    from hp_recompute.plan import RunError

    csv_path = tmp_path / "plan.csv"
    subprocess.run([str(PLAN_TOOL), "--schedule-gen", "zbv", "--ranks", "2", "--microbatches", "2", "--emit",
                    "torch-csv", "-o", str(csv_path)], check=True)
    load_torch_csv(str(csv_path))  # the undamaged pair reads
    side_path = tmp_path / "plan.hpr.json"
    side = json.loads(side_path.read_text())
    damage(side)
    side_path.write_text(json.dumps(side))
    with pytest.raises(RunError, match="hp_recompute: .*" + re.escape(message)):
        load_torch_csv(str(csv_path))


def test_a_split_stage_without_torchs_stage_caches_is_ours_only_where_the_plan_counts_on_the_release() -> None:
    """hpr.stages.our-split: on torch 2.13 every split stage runs hp_recompute's split (its I releases what W
    does not read, as the plan prices it); where torch lacks the stage caches that split reads,
    a plain stage runs torch's I, and a plan that counts on the release is refused, not run
    above its planned memory."""
    from types import SimpleNamespace

    from hp_recompute.errors import RunError
    from hp_recompute.pipelining.schedule import split_stages
    from hp_recompute.plan.reader import Action

    program = [Action("forward", 1, 0), Action("backward_input", 1, 0), Action("backward_weight", 1, 0)]
    cached = SimpleNamespace(stage_index=1, submod=torch.nn.Linear(2, 2), _stage_meta=object())
    bare = SimpleNamespace(stage_index=1, submod=torch.nn.Linear(2, 2))
    assert split_stages([cached], program) == {1}
    assert split_stages([bare], program) == set()
    with pytest.raises(RunError, match=r"stage 1 has sessions the plan prices as released after dx "
                                       r"\(replay_weight_bytes\) and the plan splits its backward"):
        split_stages([bare], program, releases=lambda stage: True)
