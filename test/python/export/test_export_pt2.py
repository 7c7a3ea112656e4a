"""pytest: ``python -m hp_recompute.export -o OUT.pt2`` (torch.export programs).

On torch 2.x the exporter writes a program torch can load back and a sidecar
whose FLOPs count SDPA as torch's FlopCounterMode does; on a torch without
torch.export it refuses ``.pt2`` with a message and exit status 1.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GPT_SDPA = os.path.join(ROOT, "examples", "gpt", "model.py") + ":build_sdpa"
GPT = os.path.join(ROOT, "examples", "gpt", "model.py") + ":build"

sys.path.insert(0, os.path.join(ROOT, "python"))
from hp_recompute import export as hexport  # noqa: E402
from cli_processes import run_module  # noqa: E402


def run_export(*args: str) -> subprocess.CompletedProcess:
    return run_module("hp_recompute.export", args)


@pytest.mark.skipif(not hasattr(torch, "export"), reason="needs torch.export (torch 2.x)")
def test_exporter_writes_a_loadable_program_and_counts_sdpa(tmp_path):
    out = tmp_path / "gpt-sdpa.pt2"
    proc = run_export("--module", GPT_SDPA, "--input-shape", "4x40", "--input-dtype", "int64",
                      "-o", str(out), "--model-json", str(tmp_path / "m.json"))
    assert proc.returncode == 0, proc.stderr
    program = torch.export.load(str(out))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "aten.scaled_dot_product_attention.default" in targets

    from torch.utils import flop_counter

    def cpu_sdpa(query_shape, key_shape, value_shape, *args, **kwargs):
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    model = hexport.load_factory(GPT_SDPA)
    inputs = hexport.make_inputs([[4, 40]], [torch.int64])
    counter = flop_counter.FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa})
    with counter:
        model(*inputs)
    counts = counter.get_flop_counts()
    sidecar = json.loads((tmp_path / "gpt-sdpa.json").read_text())
    for region in sidecar["regions"]:
        if region["checkpointable"]:
            expected = sum(counts["GPT." + region["name"]].values())
            assert region["fwd_flops"] == pytest.approx(expected, rel=0.02), region["name"]


@pytest.mark.skipif(hasattr(torch, "export"), reason="torch.export exists here")
def test_exporter_refuses_pt2_without_torch_export(tmp_path):
    out = tmp_path / "gpt.pt2"
    proc = run_export("--module", GPT, "--input-shape", "4x40", "--input-dtype", "int64",
                      "-o", str(out))
    assert proc.returncode == 1
    assert "writing .pt2 needs torch.export (torch 2.x)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not (tmp_path / "gpt.json").exists()
