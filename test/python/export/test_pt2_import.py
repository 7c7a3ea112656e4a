"""pytest: the planner's torch.export (.pt2) import against what torch measures.

Each model is exported with ``torch.export.save`` and read by
``hp-recompute-plan`` with no sidecar. Its per-region costs are compared with
two measurements of the eager model made by torch itself:

* ``saved_bytes`` with what autograd saves (``saved_tensors_hooks``, distinct
  storages, parameters excluded: ``hp_recompute.export.measure``), within 5%;
* ``fwd_flops`` with ``torch.utils.flop_counter.FlopCounterMode`` per module,
  within 15% (the planner also counts element-wise work, which the counter
  leaves out).

And the exporter's ``fwd_flops`` (the dispatched kernels, priced by the
planner's op table through ``hp_recompute._planner``) equal the importer's for
the same model's ``.pt2`` (its ops, priced by the same table): one table, two
views of one model, no difference allowed.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BUILD = os.environ.get("HPR_BUILD_DIR", os.path.join(ROOT, "build"))
PLAN = os.path.join(BUILD, "bin", "hp-recompute-plan")
sys.path.insert(0, os.path.join(ROOT, "python"))

from hp_recompute import export as hexport  # noqa: E402
from hp_recompute.export.measure import measure_regions  # noqa: E402


def _schema_major() -> int:
    try:
        from torch._export.serde.schema import SCHEMA_VERSION
    except ImportError:
        return 0
    return SCHEMA_VERSION[0]


pytestmark = pytest.mark.skipif(
    not hasattr(torch, "export") or _schema_major() != 8,
    reason=f"torch {torch.__version__} does not write torch.export schema version 8")

EXAMPLES = [
    ("gpt/model.py:build", [[4, 40]], "int64"),
    ("gpt/model.py:build_sdpa", [[4, 40]], "int64"),
    ("mlp/model.py:build", [[8, 32]], "float32"),
    ("cnn/model.py:build", [[4, 3, 16, 16]], "float32"),
    ("pipelining/model.py:build", [[8, 16]], "int64"),
]


def planned_regions(path: str) -> dict:
    proc = subprocess.run([PLAN, "--model", path, "--schedule-gen", "1f1b", "--ranks", "2",
                           "--microbatches", "2", "--emit", "json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr, proc.stderr  # every op has a rule
    plan = json.loads(proc.stdout)
    return {r["name"]: r for stage in plan["model"]["stages"] for r in stage["regions"]}


def module_flops(model: torch.nn.Module, inputs) -> dict:
    """FLOPs per module path, counted by torch's FlopCounterMode.

    torch's table covers the CUDA attention kernels; the CPU one gets the
    same formula (torch's own) so that SDPA is counted here too.
    """
    from torch.utils import flop_counter
    aten = torch.ops.aten
    def cpu_sdpa(query_shape, key_shape, value_shape, *args, **kwargs):
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    mapping = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = cpu_sdpa
    counter = flop_counter.FlopCounterMode(display=False, custom_mapping=mapping)
    with counter:
        model(*inputs)
    root = type(model).__name__ + "."
    return {name[len(root):]: sum(ops.values())
            for name, ops in counter.get_flop_counts().items() if name.startswith(root)}


@pytest.mark.parametrize("factory,shapes,dtype", EXAMPLES)
def test_pt2_costs_match_torch(tmp_path, factory, shapes, dtype):
    model = hexport.load_factory(os.path.join(ROOT, "examples", factory))
    model.train()
    dtypes = hexport.parse_dtypes(dtype, len(shapes))
    inputs = hexport.make_inputs(shapes, dtypes)
    path = str(tmp_path / "model.pt2")
    torch.export.save(torch.export.export(model, tuple(inputs)), path)
    regions = planned_regions(path)

    segments = measure_regions(model, inputs)
    assert [s.name for s in segments] == list(regions)
    flops = module_flops(model, inputs)
    checked = 0
    for seg in segments:
        got = regions[seg.name]
        saved = sum(seg.saved.values())
        assert got["saved_bytes"] == pytest.approx(saved, rel=0.05), seg.name
        assert got["input_bytes"] == sum(seg.inputs.values()), seg.name
        assert got["param_bytes"] == sum(seg.params.values()), seg.name
        if seg.checkpointable:
            assert got["fwd_flops"] == pytest.approx(flops[seg.name], rel=0.15), seg.name
            checked += 1
    assert checked >= 2


def test_bundled_sdpa_program_plans():
    """examples/gpt/gpt-sdpa.pt2 (examples/regenerate.sh) imports with SDPA regions."""
    regions = planned_regions(os.path.join(ROOT, "examples", "gpt", "gpt-sdpa.pt2"))
    blocks = [r for r in regions.values() if r["checkpointable"]]
    assert [r["name"] for r in blocks] == [f"blocks.{i}" for i in range(8)]
    # q, k, v live in the qkv projection's output: one storage, not three.
    model = hexport.load_factory(os.path.join(ROOT, "examples", "gpt", "model.py:build_sdpa"))
    inputs = hexport.make_inputs([[4, 40]], [torch.int64])
    measured = {s.name: sum(s.saved.values()) for s in measure_regions(model, inputs)}
    for r in blocks:
        assert r["saved_bytes"] == pytest.approx(measured[r["name"]], rel=0.05)


class _DropoutBlock(nn.Module):
    """The ops the two FLOP tables used to price differently: dropout (training), full_like,
    type_as; and a layer norm, a GELU, a softmax, whose kernels have other names."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.nn.functional.gelu(self.fc(self.norm(x))))
        h = h + torch.full_like(h, 0.5)
        return torch.softmax(h, dim=-1).type_as(x) + x


class _DropoutModel(nn.Module):
    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_DropoutBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum()


class _IdentityModel(nn.Module):
    """blocks.1 is an nn.Identity: it runs no op, so the .pt2 has no node in it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(16, 16), nn.Identity(), nn.Linear(16, 16)])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum()


@pytest.mark.parametrize("factory,shapes,dtype", EXAMPLES + [("dropout", [[8, 16]], "float32"),
                                                            ("identity", [[8, 16]], "float32")])
def test_exporter_flops_are_the_importers(tmp_path, factory, shapes, dtype):
    """The sidecar's FLOPs (measure_regions) equal what the planner prices the .pt2 at, on the
    same regions (one segmentation: segment_ops)."""
    if factory == "dropout":
        torch.manual_seed(0)
        model = _DropoutModel()
    elif factory == "identity":
        model = _IdentityModel()
    else:
        model = hexport.load_factory(os.path.join(ROOT, "examples", factory))
    model.train()
    inputs = hexport.make_inputs(shapes, hexport.parse_dtypes(dtype, len(shapes)))
    path = str(tmp_path / "model.pt2")
    torch.export.save(torch.export.export(model, tuple(inputs)), path)
    regions = planned_regions(path)
    segments = measure_regions(model, inputs)
    assert [s.name for s in segments] == list(regions)
    for seg in segments:
        assert regions[seg.name]["fwd_flops"] == pytest.approx(seg.flops, rel=1e-9), seg.name
    assert all(s.flops > 0 for s in segments if s.checkpointable)


def test_exporter_regions_are_the_importers_for_an_identity_region(tmp_path):
    """The exporter's model JSON and the planner's for the .pt2 name the same regions, with the
    same costs: no region for blocks.1, which runs no op (the exporter used to make one)."""
    torch.manual_seed(0)
    model = _IdentityModel()
    shapes, dtypes = [[8, 16]], [torch.float32]
    out = str(tmp_path / "m.pt2")
    hexport.export(model, shapes, dtypes, out, model_json=str(tmp_path / "exported.json"))
    imported = planned_regions(out)
    exported = json.loads((tmp_path / "exported.json").read_text())["regions"]
    assert [r["name"] for r in exported] == list(imported) == ["blocks.0", "blocks.2", "head"]
    for r in exported:
        for key in ["checkpointable", "saved_bytes", "input_bytes", "param_bytes"]:
            assert r[key] == imported[r["name"]][key], (r["name"], key)
        assert r["fwd_flops"] == int(imported[r["name"]]["fwd_flops"]), r["name"]


def test_exporter_refuses_a_repeated_region_call_as_the_importer_does(tmp_path):
    """The exporter's message for a region module called twice is the .pt2 importer's, both
    from segmentOps; only the located op differs."""
    sys.path.insert(0, os.path.dirname(__file__))
    from test_export_sidecar import REPEATED, _TWICE, export_twice

    namespace: dict = {}
    exec(_TWICE, namespace)
    for factory in ["adjacent", "after_other_code"]:
        model = namespace[factory]()
        path = str(tmp_path / f"{factory}.pt2")
        torch.export.save(torch.export.export(model, (torch.randn(4, 8),)), path)
        planned = subprocess.run([PLAN, "--model", path, "--schedule-gen", "1f1b", "--ranks",
                                  "1", "--microbatches", "1", "--emit", "json"],
                                 capture_output=True, text=True)
        assert planned.returncode == 1 and REPEATED in planned.stderr, planned.stderr
        exported = export_twice(tmp_path, factory, str(tmp_path / f"{factory}-out.pt2"))
        assert exported.returncode == 1 and REPEATED in exported.stderr, exported.stderr
        tail = planned.stderr[planned.stderr.index("module 'blocks.0'"):].strip()
        assert exported.stderr[exported.stderr.index("module 'blocks.0'"):].strip() == tail
        assert not os.path.exists(str(tmp_path / f"{factory}-out.pt2"))
