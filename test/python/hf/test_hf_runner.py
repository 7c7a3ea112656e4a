"""``python -m hp_recompute.run --model FILE.py:FACTORY`` on a transformers causal LM, no adapter.

The runner takes the model as HF builds it: its regions are the costs tool's (``model``,
``model.layers.N``, ``model+lm_head``), each a stage module of that part
(``hp_recompute.hf.causal_lm_regions``), the batches random input ids of ``--input-shape``
and the loss the next-token cross-entropy of its logits. A ZBV plan from the model's measured
costs runs on two processes with the whole model's gradients, each layer replayed once per
microbatch; what the runner cannot run as planned is refused before any rank starts.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cli_processes import run_module

pytest.importorskip("transformers", reason="needs transformers (requirements.txt)")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
MODELS = HERE / "hf_models.py"
PLAN_TOOL = Path(os.environ.get("HPR_BUILD_DIR", REPO / "build")) / "bin" / "hp-recompute-plan"


def _plan(tmp_path: Path, factory: str) -> Path:
    """A 2-rank ZBV plan (4 microbatches) of ``factory``'s model, from its measured costs."""
    costs, plan = tmp_path / f"{factory}.costs.json", tmp_path / f"{factory}.plan.json"
    proc = run_module("hp_recompute.costs", ["--module", f"{MODELS}:{factory}", "--input-shape", "2x16",
                                             "--input-dtype", "int64", "--repeats", "2", "--warmup", "1", "-o",
                                             str(costs)], timeout=600)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([str(PLAN_TOOL), "--model", str(costs), "--schedule-gen", "zbv", "--ranks", "2",
                           "--microbatches", "4", "--emit", "json", "-o", str(plan)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return plan


@pytest.mark.parametrize("factory,processes", [("llama", True), ("gpt2", False)])
def test_runner_trains_a_hf_model_from_its_factory(tmp_path: Path, factory: str, processes: bool) -> None:
    # costs need the cache off; the runner takes the model as HF builds it (use_cache on: stages run without it)
    plan = _plan(tmp_path, "llama_no_cache" if factory == "llama" else factory)
    report = tmp_path / "report.json"
    proc = run_module("hp_recompute.run", ["--plan", str(plan), "--model", f"{MODELS}:{factory}", "--input-shape",
                                           "2x16", "--report", str(report),
                                           *([] if processes else ["--single-process"])], timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result = json.loads(report.read_text())
    assert result["ok"] is True and result["grads_match"] is True
    assert result["model"] == {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}[factory]
    stages = json.loads(plan.read_text())["model"]["stages"]
    checkpointed = [r["name"] for s in stages for r in s["regions"] if r.get("checkpoint", False)]
    assert checkpointed and all(name.split(".")[-1].isdigit() for name in checkpointed)
    # one replay per checkpointed layer and microbatch: a dx/dw split does not replay twice
    assert result["recomputes"] == result["recomputes_expected"] == 4 * len(checkpointed)


@pytest.mark.parametrize("factory,args,code,message", [
    ("gpt2_tied", [], 1, "hp_recompute.run: --model: 'lm_head.weight' is another parameter's too (tied weights, "
                         "tie_word_embeddings): each region's parameters are its own; build the model with "
                         "config.tie_word_embeddings=False"),
    ("llama_checkpointed", [], 1, "hp_recompute.run: --model: Hugging Face's gradient checkpointing is on in "
                                  "'model' and 4 more; the plan checkpoints the layers itself (the two "
                                  "would nest): build the model without it"),
    ("llama", ["--input-shape", "2x65"], 1, "hp_recompute.run: --input-shape: LlamaForCausalLM takes input ids of "
                                            "shape BATCHxSEQUENCE, SEQUENCE at most 64; got 2x65"),
    ("llama", ["--input-shape", "2x"], 2, "--input-shape: expected BATCHxSEQUENCE, two integers in [1, 1048576] "
                                          "(e.g. 2x64), got '2x'"),
])
def test_runner_refuses_what_it_cannot_run_as_planned(tmp_path: Path, factory: str, args: list, code: int,
                                                      message: str) -> None:
    plan = tmp_path / "plan.json"
    proc = subprocess.run([str(PLAN_TOOL), "--schedule-gen", "zbv", "--ranks", "2", "--microbatches", "4", "--emit",
                           "json", "-o", str(plan)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = run_module("hp_recompute.run", ["--plan", str(plan), "--model", f"{MODELS}:{factory}", "--single-process",
                                           *args], timeout=600)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_input_shape_is_refused_for_a_model_that_draws_its_own_batches(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    proc = subprocess.run([str(PLAN_TOOL), "--model", str(REPO / "examples/gpt/gpt.model.json"), "--schedule-gen",
                           "zbv", "--ranks", "2", "--microbatches", "4", "--emit", "json", "-o", str(plan)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = run_module("hp_recompute.run", ["--plan", str(plan), "--input-shape", "2x8", "--single-process"],
                      timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert ("hp_recompute.run: --input-shape: only a Hugging Face causal LM's input ids take a shape from the "
            "command line; model 'gpt' draws its own batches (make_batch)") in proc.stderr
