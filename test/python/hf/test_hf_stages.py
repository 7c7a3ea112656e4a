"""``hp_recompute.hf.stage_module``: transformers causal LMs as torch pipeline stages under a plan.

Against the real transformers package: every supported family's stages, chained, compute
the whole model's logits bit for bit (Qwen2 with sliding-window layers on one stage only,
GPT-2 with its absolute positions); a Llama costed by ``python -m hp_recompute.costs
--module`` and planned ZBV on 2 gloo ranks trains under ``PlannedSchedule`` with the whole
model's gradients, its layers run twice per microbatch (forward, one replay), through
torch's whole-batch call and torchtitan 0.3's microbatched one; the refusals name the fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from cli_processes import run_module

pytest.importorskip("torch.distributed.pipelining", reason="needs torch.distributed.pipelining")
pytest.importorskip("transformers", reason="needs transformers (requirements.txt)")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hf_models  # noqa: E402
import hf_stage_worker  # noqa: E402

import hp_recompute as hr  # noqa: E402
from hp_recompute import hf  # noqa: E402
from rank_processes import spawn_ranks  # noqa: E402
from hp_recompute.errors import RunError  # noqa: E402

pytestmark = pytest.mark.slow  # starts rank processes or torchrun (test/python/conftest.py)

REPO = HERE.parents[2]
PLAN_TOOL = Path(os.environ.get("HPR_BUILD_DIR", REPO / "build")) / "bin" / "hp-recompute-plan"
FAMILIES = ["llama", "mistral", "qwen2", "phi3", "gpt2"]


def layer_plan(tmp: Path, family: str, schedule: str = "zbv", layers: int = 4, stages: Any = None) -> Dict[str, Any]:
    """A plan over a model JSON naming ``family``'s parts as ``costs --module`` names them."""
    layout = hf.LAYOUTS[family]

    def region(name: str, checkpointable: bool) -> Dict[str, Any]:
        return {"name": name, "checkpointable": checkpointable, "fwd_flops": 1e5, "saved_bytes": 4096,
                "input_bytes": 512, "param_bytes": 4352}
    regions = ([region(layout.base, False)]
               + [region(f"{layout.base}.{layout.layers}.{i}", True) for i in range(layers)]
               + [region(f"{layout.base}+{layout.head}", False)])
    path = tmp / f"{family}.model.json"
    path.write_text(json.dumps({"format": "hp-recompute-model", "version": 1, "name": family, "regions": regions}))
    return hr.make_plan(model=str(path), schedule_gen=schedule, ranks=2, microbatches=4, stages=stages)


@pytest.mark.parametrize("family", FAMILIES)
def test_stages_chained_compute_the_whole_models_logits(tmp_path: Path, family: str) -> None:
    model = hf_models.build(family)
    plan = layer_plan(tmp_path, family)
    stages = [hf.stage_module(model, plan, s) for s in range(4)]
    assert [s.layer_ids for s in stages] == [(0,), (1, 2), (3,), ()]
    x = torch.randint(0, hf_models.VOCAB, (2, hf_models.SEQ), generator=torch.Generator().manual_seed(3))
    h = x
    for stage in stages:
        h = stage(h)
    assert torch.equal(h, model(x).logits)
    # The full model's names; the parameters are the model's own.
    whole = dict(model.named_parameters())
    for stage in stages:
        for name, p in stage.named_parameters():
            assert whole[name] is p, name
    assert {n for s in stages for n, _ in s.named_parameters()} == set(whole)


def test_hf_checkpointing_left_on_is_refused(tmp_path: Path) -> None:
    model = hf_models.build("llama")
    model.activation_checkpointing_enable()
    with pytest.raises(RunError, match=r"gradient checkpointing is on in 'model' and 4 more.*"
                                       r"gradient_checkpointing_disable\(\)"):
        hf.stage_module(model, layer_plan(tmp_path, "llama"), 0)


def test_other_families_and_wrong_plans_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RunError, match=r"Linear \(model_type None\) is not a causal LM of a supported family"):
        hf.stage_module(torch.nn.Linear(2, 2), layer_plan(tmp_path, "llama"), 0)
    with pytest.raises(RunError, match=r"<plan dict>: stage 2's region 'model.layers.4' is no decoder layer of "
                                       r"this model \(4 layers under 'model.layers'\)"):
        hf.stage_module(hf_models.build("llama"), layer_plan(tmp_path, "llama", layers=6), 0)
    with pytest.raises(RunError, match=r"stage must be in \[0, 4\)"):
        hf.stage_module(hf_models.build("llama"), layer_plan(tmp_path, "llama"), 4)


def test_tied_weights_on_two_ranks_are_refused_and_on_one_rank_shared(tmp_path: Path) -> None:
    model = hf_models.build("gpt2", tie=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    with pytest.raises(RunError, match=r"'lm_head.weight' of stage 1 is 'transformer.wte.weight' of stage 0 \(tied "
                                       r"weights\), on ranks 0 and 1.*V-shaped schedule"):
        hf.stage_module(model, layer_plan(tmp_path, "gpt2", schedule="1f1b"), 0)
    # ZBV puts stages 0 and 3 on rank 0: one parameter, both halves of its gradient
    plan = layer_plan(tmp_path, "gpt2")
    first, last = hf.stage_module(model, plan, 0), hf.stage_module(model, plan, 3)
    assert first.transformer.wte.weight is last.lm_head.weight


@pytest.fixture(scope="module")
def llama_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's path: costs measured on the model (caches off), a ZBV plan on 2 ranks."""
    tmp = tmp_path_factory.mktemp("hf_llama")
    proc = run_module("hp_recompute.costs", ["--module", f"{HERE / 'hf_models.py'}:llama_no_cache", "--input-shape",
                                             f"2x{hf_models.SEQ}", "--input-dtype", "int64", "--repeats", "2",
                                             "--warmup", "1", "-o", str(tmp / "llama.json")])
    assert proc.returncode == 0, proc.stderr
    assert PLAN_TOOL.exists(), f"build the project first: {PLAN_TOOL} is missing"
    # A fixed split by module paths (the balanced one follows the measured times): rank 0 holds stages 0
    # and 3 under ZBV, layers 0 and 3; rank 1 layers 1 and 2.
    stages = "0:model,model.layers.0;1:model.layers.1;2:model.layers.2;3:model.layers.3,model+lm_head"
    subprocess.run([str(PLAN_TOOL), "--model", str(tmp / "llama.json"), "--schedule-gen", "zbv", "--ranks", "2",
                    "--microbatches", "4", "--stages", stages, "--emit", "json", "-o", str(tmp / "plan.json")],
                   check=True, capture_output=True)
    return tmp / "plan.json"


def _run_stages(tmp_path: Path, family: str, plan: Path, **extra: Any) -> List[Dict[str, Any]]:
    out = tmp_path / "out"
    out.mkdir()
    cfg = {"store": str(tmp_path / "store"), "ranks": 2, "microbatches": 4, "family": family, "plan": str(plan),
           "out": str(out), **extra}
    return spawn_ranks(hf_stage_worker.main, cfg, 2)


def test_llama_stages_train_under_a_zbv_plan_on_two_ranks(tmp_path: Path, llama_plan: Path) -> None:
    results = _run_stages(tmp_path, "llama", llama_plan)
    covered = set()
    for rank, res in enumerate(results):
        covered |= set(res["params"])
        assert set(res["grads_whole"]) == set(res["grads_mbs"]) == set(res["ref_grads"]) == set(res["params"])
        for name, want in res["ref_grads"].items():
            torch.testing.assert_close(res["grads_whole"][name], want, rtol=1e-5, atol=1e-7, msg=name)
            torch.testing.assert_close(res["grads_mbs"][name], want, rtol=1e-5, atol=1e-7, msg=name)
        for got in (res["losses_whole"], res["losses_mbs"]):
            assert len(got) == len(res["ref_losses"])
            for a, b in zip(got, res["ref_losses"]):
                torch.testing.assert_close(a, b)
        assert res["layers"], rank
        assert res["calls"] == {name: 2 * 4 for name in res["layers"]}, (rank, res["calls"])
    assert covered == {n for n, _ in hf_models.build("llama").named_parameters()}
    assert results[0]["ref_losses"], "rank 0 holds the last stage under ZBV"


def test_tied_gpt2_on_one_rank_trains_with_its_whole_gradient(tmp_path: Path) -> None:
    """GPT-2's tied embedding and head on ZBV's rank 0 (stages 0 and 3): one parameter, both
    halves of its gradient, scaled once (hpr.exec.gradient-scaling; torch's per-stage scaling
    divided it at stage 3's reduce_grad and again at stage 0's, up to 75% off)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(layer_plan(tmp_path, "gpt2")))
    results = _run_stages(tmp_path, "gpt2", plan, tie=True)
    assert "lm_head.weight" in results[0]["grads_mbs"] and "transformer.wte.weight" in results[0]["grads_mbs"]
    for rank, res in enumerate(results):
        assert set(res["grads_mbs"]) == set(res["ref_grads"]) == set(res["params"]), rank
        for name, want in res["ref_grads"].items():
            torch.testing.assert_close(res["grads_mbs"][name], want, rtol=1e-5, atol=1e-7, msg=name)


def test_the_example_trains_under_torchrun(tmp_path: Path) -> None:
    """examples/huggingface/train.py as docs/huggingface.md runs it: the same losses as torch's
    ZBV with its checkpoint on the same stages, each layer run twice per microbatch (forward and
    one replay) after the first step, where torch's ZBV runs it more often."""
    plan = tmp_path / "plan.json"
    # ZBV puts stages 0 and 3 on rank 0: layers in both, so its I/W split reads replays there
    stages = ("0:model,model.layers.0,model.layers.1;1:model.layers.2,model.layers.3,model.layers.4;"
              "2:model.layers.5;3:model.layers.6,model.layers.7,model+lm_head")
    plan.write_text(json.dumps(layer_plan(tmp_path, "llama", layers=8, stages=stages)))
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS="1")
    runs = {}
    for schedule in ("planned", "torch-zbv"):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(REPO / "examples/huggingface/train.py"), "--plan", str(plan), "--steps", "2",
                               "--schedule", schedule], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[schedule] = re.findall(r"step (\d): loss ([0-9.]+), rank 0 layer forwards per microbatch ([0-9.]+)",
                                    proc.stdout)
        assert [s[0] for s in runs[schedule]] == ["0", "1"], proc.stdout
    assert [s[1] for s in runs["planned"]] == [s[1] for s in runs["torch-zbv"]]
    assert float(runs["planned"][1][2]) == 2.0
    assert float(runs["torch-zbv"][1][2]) > 2.0
