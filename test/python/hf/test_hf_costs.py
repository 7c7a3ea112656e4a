"""Costs and export of transformers models as HF builds them (``use_cache=True``, ModelOutput).

``python -m hp_recompute.costs --module`` on a Llama with its default ``use_cache=True``
refuses, naming ``use_cache`` (each measured call grew the KV cache: before, a layer's
checkpoint state read 7x its size, silently); with the cache off it measures, in two
processes too. The exporter traces and exports the model's logits (its output also holds
the cache, which no tracer takes), and the planner plans the program.
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
INPUTS = ["--input-shape", "2x16", "--input-dtype", "int64"]
QUICK = ["--repeats", "2", "--warmup", "1"]


@pytest.mark.parametrize("factory,what", [
    ("llama", "keeps 4096 bytes beyond its outputs after each call"),
    # the sliding-window cache keeps the window: the same call fails the second time
    ("qwen2_sliding", "fails when called again on the same arguments"),
])
def test_costs_refuse_a_model_growing_its_cache_and_name_use_cache(tmp_path: Path, factory: str, what: str) -> None:
    out = tmp_path / "model.json"
    proc = run_module("hp_recompute.costs", ["--module", f"{MODELS}:{factory}", *INPUTS, "-o", str(out), *QUICK],
                      timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert f"hp_recompute.costs: region 'model.layers.0' {what}" in proc.stderr
    assert "given cache=DynamicCache" in proc.stderr
    assert "build the model with use_cache=False" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_costs_with_the_cache_off_in_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "llama.json"
    proc = run_module("hp_recompute.costs", ["--module", f"{MODELS}:llama_no_cache", *INPUTS, "--processes", "2",
                                             "-o", str(out), *QUICK], timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "its tensor 'logits'" in proc.stderr  # CausalLMOutputWithPast: its logits measured
    regions = json.loads(out.read_text())["regions"]
    layers = [r for r in regions if r["name"].startswith("model.layers.")]
    assert [r["name"] for r in layers] == [f"model.layers.{i}" for i in range(4)]
    # The checkpoint keeps the RNG state only (5056 bytes of CPU generator state on torch 2.13),
    # the same for every layer: no cache in it.
    assert len({r["checkpoint_state_bytes"] for r in layers}) == 1
    assert layers[0]["checkpoint_state_bytes"] < layers[0]["saved_bytes"] / 10


@pytest.mark.parametrize("suffix", [".pt2", ".pt"])
def test_export_takes_the_logits_of_a_model_output(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"llama{suffix}"
    proc = run_module("hp_recompute.export", ["--module", f"{MODELS}:llama", *INPUTS, "-o", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "the model returns CausalLMOutputWithPast; using its tensor 'logits'" in proc.stderr
    if suffix == ".pt2":
        plan = subprocess.run([str(PLAN_TOOL), "--model", str(out), "--schedule-gen", "zbv", "--ranks", "2",
                               "--microbatches", "4", "--emit", "json"], capture_output=True, text=True)
        assert plan.returncode == 0, plan.stderr
        assert "no cost rule" not in plan.stderr, plan.stderr
        stages = json.loads(plan.stdout)["model"]["stages"]
        assert [r["name"] for r in stages[0]["regions"]][:2] == ["model", "model.layers.0"]
        assert sum(r["name"].startswith("model.layers.") for s in stages for r in s["regions"]) == 4


def test_export_model_output_names_a_field(tmp_path: Path) -> None:
    out = tmp_path / "llama.pt2"
    proc = run_module("hp_recompute.export", ["--module", f"{MODELS}:llama", *INPUTS, "--model-output", "hidden",
                                              "-o", str(out)], timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert ("hp_recompute: --model-output hidden: the model's output (CausalLMOutputWithPast) has no tensor 'hidden'; "
            "its tensors: logits") in proc.stderr
    assert not out.exists()
