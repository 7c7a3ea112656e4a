"""pytest: the exporter's sidecar saved_bytes against an independent count.

The exporter counts saved tensors with saved_tensors_hooks over one full
forward. Here each region module is re-run alone and the autograd graph of
its output is walked, reading every ``grad_fn._saved_*`` tensor: a different
mechanism, so a bug in either shows up as a mismatch (tolerance 2%).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

from hp_recompute import export as hexport  # noqa: E402
from cli_processes import run_module  # noqa: E402

EXAMPLES = [
    ("gpt", [[4, 40]], "int64", "blocks"),
    ("mlp", [[8, 32]], "float32", "layers"),
    ("cnn", [[4, 3, 16, 16]], "float32", "stages"),
]


def graph_saved_bytes(out: torch.Tensor, exclude: set) -> int:
    """Distinct storages reachable as grad_fn._saved_* tensors from ``out``."""
    seen_nodes, storages, todo = set(), {}, [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen_nodes:
            continue
        seen_nodes.add(fn)
        for attr in dir(fn):
            if not attr.startswith("_saved_"):
                continue
            value = getattr(fn, attr)
            values = value if isinstance(value, (tuple, list)) else [value]
            for v in values:
                if isinstance(v, torch.Tensor):
                    ptr = v.storage().data_ptr()
                    if ptr not in exclude:
                        storages[ptr] = v.storage().nbytes()
        todo.extend(f for f, _ in fn.next_functions)
    return sum(storages.values())


@pytest.mark.parametrize("name,shapes,dtype,container", EXAMPLES)
def test_sidecar_saved_bytes_match_autograd_graph(tmp_path, name, shapes, dtype, container):
    model = hexport.load_factory(os.path.join(ROOT, "examples", name, "model.py") + ":build")
    dtypes = hexport.parse_dtypes(dtype, len(shapes))
    out = str(tmp_path / f"{name}.pt")
    sidecar = hexport.export(model, shapes, dtypes, out)
    assert os.path.exists(out)
    with open(str(tmp_path / f"{name}.json")) as f:
        assert json.load(f) == sidecar

    # Capture each region's input during one forward, then re-run it alone.
    inputs = hexport.make_inputs(shapes, dtypes)
    captured = {}
    blocks = getattr(model, container)
    hooks = [b.register_forward_pre_hook(
        lambda m, args, i=i: captured.__setitem__(i, args[0].detach()))
        for i, b in enumerate(blocks)]
    model(*inputs)
    for h in hooks:
        h.remove()
    exclude = {p.storage().data_ptr() for p in list(model.parameters()) + list(model.buffers())}
    by_name = {r["name"]: r for r in sidecar["regions"]}
    assert [r["name"] for r in sidecar["regions"] if r["checkpointable"]] == \
        [f"{container}.{i}" for i in range(len(blocks))]
    for i, block in enumerate(blocks):
        x = captured[i].clone().requires_grad_(True)
        expected = graph_saved_bytes(block(x), exclude | {x.storage().data_ptr()})
        # The region's own input is saved by its first op in the full run too.
        expected_with_input = graph_saved_bytes(block(x), exclude)
        got = by_name[f"{container}.{i}"]["saved_bytes"]
        assert expected > 0
        assert abs(got - expected_with_input) <= 0.02 * expected_with_input, \
            (name, i, got, expected_with_input, expected)


def test_cli_writes_pt_sidecar_ir_and_model_json(tmp_path):
    out = tmp_path / "m.pt"
    proc = run_module(
        "hp_recompute.export", ["--module", os.path.join(ROOT, "examples", "mlp", "model.py") + ":build",
                                "--input-shape", "8x32", "-o", str(out), "--ir", str(tmp_path / "m.ir"),
                                "--model-json", str(tmp_path / "m.model.json")])
    assert proc.returncode == 0, proc.stderr
    loaded = torch.jit.load(str(out))
    assert loaded(torch.randn(8, 32)).shape == (8, 10)
    graph = json.loads((tmp_path / "m.model.json").read_text())
    assert graph["format"] == "hp-recompute-model"
    assert sum(r["checkpointable"] for r in graph["regions"]) == 16
    # The IR text parses with torch's own parser once scopes are stripped.
    text = (tmp_path / "m.ir").read_text()
    assert "%self.layers.0.fc1.weight" in text and "scope: __module.layers.0" in text


@pytest.mark.parametrize("argv,message", [
    (["--input-shape", "4xx3"], "hp_recompute: --input-shape:1:3: expected a positive integer dimension in shape "
                                "'4xx3', got ''"),
    (["--input-shape", "8x32", "--input-dtype", "complex"], "hp_recompute: --input-dtype:1:1: expected a dtype "
                                                            "(float32, float16, bfloat16, float64, int64, int32, "
                                                            "int16, int8, uint8, bool), got 'complex'"),
    (["--input-shape", "8x32", "--module", "nofile.py:build"], "no such file 'nofile.py'"),
    (["--input-shape", "8x32", "--module", "MLP"], "expected FILE.py:FACTORY"),
    (["--input-shape", "8x32", "--region-depth", "2"], "model.py:build: no regions at region depth 2: the model calls no element"),
    (["--input-shape", "8x33"], "the model fails on inputs 8x33 float32 (--input-shape, --input-dtype): "
                                "RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    (["--input-shape", "8x32,8x32"], "the model fails on inputs 8x32 float32, 8x32 float32"),
    (["--input-shape", "8x32", "--input-dtype", "int64"], "the model fails on inputs 8x32 int64"),
    (["--input-shape", "99999999x99999999"], "elements in all; at most 2147483648 are built"),
    (["--input-shape", "8x32", "--ir", "/nonexistent-dir/m.ir"], "--ir /nonexistent-dir/m.ir: no directory"),
    (["--input-shape", "8x32", "--model-json", "{tmp}"], "is a directory"),
])
def test_cli_bad_input(tmp_path, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    base = ["--module", os.path.join(ROOT, "examples", "mlp", "model.py") + ":build",
            "-o", str(tmp_path / "m.pt")]
    proc = run_module("hp_recompute.export", base + argv)
    assert proc.returncode == 1
    assert proc.stderr.startswith("hp_recompute:") and "Traceback" not in proc.stderr
    assert message in proc.stderr
    assert list(tmp_path.iterdir()) == [], "no output, not even part of one"


def test_the_exporter_reads_input_flags_with_the_planners_grammar():
    """One parser (lib/Model/ShapeList.cpp) for the exporter and hp-recompute-plan's TorchScript import."""
    assert hexport.parse_shapes(" 4 x 040, 2") == [[4, 40], [2]]
    assert hexport.parse_dtypes("short, half", 2) == [torch.int16, torch.float16]
    assert hexport.parse_dtypes("long", 3) == [torch.int64] * 3
    with pytest.raises(hexport.ExportError, match=r"--input-dtype: expected 1 or 2 dtypes \(one per input\), got 3"):
        hexport.parse_dtypes("int8,int8,int8", 2)


@pytest.mark.parametrize("name", ["gpt", "mlp", "cnn"])
def test_bundled_model_json_matches_schema(name):
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(ROOT, "docs", "schemas", "model.schema.json")) as f:
        schema = json.load(f)
    with open(os.path.join(ROOT, "examples", name, f"{name}.model.json")) as f:
        doc = json.load(f)
    jsonschema.validate(doc, schema)
    bad = dict(doc, regions=[dict(doc["regions"][0], saved_bytes=-1)])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


class _Scan(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logcumsumexp(x, -1) * 2


class _Flip(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(x, [-1]) * 2


def test_ops_without_a_flop_rule_count_0_with_one_warning():
    """The exporter prices ops by the planner's table (hp_recompute._planner.op_flops) and, as
    the importers do, counts an op without a rule as 0 FLOPs and says so in one warning, each
    op once with the region it first ran in."""
    from hp_recompute.export.measure import measure_regions

    model = torch.nn.Sequential(_Scan(), _Flip(), _Scan())
    with pytest.warns(UserWarning, match=r"no FLOP rule for 'aten::logcumsumexp' \(first in region '0'\), "
                                         r"'aten::flip' \(first in region '1'\); counted as 0 FLOPs") as caught:
        segments = measure_regions(model, (torch.randn(4, 8, requires_grad=True),))
    assert len([w for w in caught if "no FLOP rule" in str(w.message)]) == 1
    assert [(s.name, s.flops) for s in segments] == [("0", 32.0), ("1", 32.0), ("2", 32.0)]  # the mul only


class _ComplexRope(torch.nn.Module):
    """torchtitan's rotary embedding: a complex view of the pairs times the complex frequencies."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        freqs = torch.polar(torch.ones(pairs.shape[-1]), torch.arange(pairs.shape[-1], dtype=torch.float32))
        return torch.view_as_real(pairs * freqs).flatten(-2)


def test_complex_rope_views_are_priced():
    """view_as_complex / view_as_real are views (0 FLOPs, no warning); the product is priced."""
    import warnings

    from hp_recompute.export.measure import measure_regions

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        segments = measure_regions(torch.nn.Sequential(_ComplexRope()), (torch.randn(4, 8, requires_grad=True),))
    assert segments[0].flops > 0


# Regions are the planner's (hp_recompute._planner.segment_ops, the importers' segmentOps): the
# exporter records the module call stack per op and asks; these are the cases where a copy of the
# rules in Python disagreed with the C++.

_TWICE = '''
import torch.nn as nn


class Twice(nn.Module):
    def __init__(self, order):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.order = order

    def forward(self, x):
        for i in self.order:
            x = self.blocks[i](x)
        return x.sum()


def adjacent():
    return Twice([0, 0, 1])


def after_other_code():
    return Twice([0, 1, 0])
'''

REPEATED = ("module 'blocks.0' is called more than once, and a region is one call of one module "
            "(regions are named by module path, which the runtime checkpoints)")


def export_twice(tmp_path, factory: str, out: str) -> subprocess.CompletedProcess:
    """Runs the exporter on the model of ``_TWICE`` that ``factory`` builds, writing ``out``."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "twice.py").write_text(_TWICE)
    return run_module("hp_recompute.export", ["--module", f"{src / 'twice.py'}:{factory}", "--input-shape", "4x8",
                                              "-o", out, "--model-json", os.path.splitext(out)[0] + ".model.json"])


@pytest.mark.parametrize("factory", ["adjacent", "after_other_code"])
def test_cli_refuses_a_region_module_called_twice(tmp_path, factory):
    """A region is one call of one module: the exporter refuses a second call as the importers
    do (it used to write a second region of the same name, which the planner refused)."""
    out = tmp_path / "out"
    out.mkdir()
    proc = export_twice(tmp_path, factory, str(out / "m.pt"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"hp_recompute: {tmp_path / 'src' / 'twice.py'}:{factory}: op ")
    assert REPEATED in proc.stderr and "Traceback" not in proc.stderr
    assert list(out.iterdir()) == [], "no output, not even part of one"


class _WithIdentity(torch.nn.Module):
    """blocks.1 runs no op: no region, as the importers see it (no op, no region)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Identity(),
                                           torch.nn.Linear(8, 6)])
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum()


def test_a_region_module_that_runs_no_op_is_no_region():
    from hp_recompute.export.measure import measure_regions

    segments = measure_regions(_WithIdentity(), (torch.randn(4, 8),))
    assert [(s.name, s.checkpointable) for s in segments] == [
        ("blocks.0", True), ("blocks.2", True), ("head", False)]
    assert (segments[1].input_shapes, segments[1].output_shapes) == ([[4, 8]], [[4, 6]])
    assert segments[2].input_shapes == []  # outside code has no module arguments


def test_a_non_ascii_digit_is_no_index():
    """Only 0-9 make a path component an index (the C++ rule; Python's isdigit() takes more)."""
    from hp_recompute.export.measure import RegionError, measure_regions

    model = torch.nn.Sequential()
    model.add_module("\u0663", torch.nn.Linear(8, 8))  # ARABIC-INDIC DIGIT THREE
    with pytest.raises(RegionError, match=r"^m: no regions at region depth 1: .*"
                                          r"\(submodule calls: \u0663\)$"):
        measure_regions(model, (torch.randn(4, 8),), name="m")
    model.add_module("3", torch.nn.Linear(8, 8))
    assert [s.name for s in measure_regions(model, (torch.randn(4, 8),))] == ["\u0663", "3"]


WEIGHT_INPUT_EXAMPLES = EXAMPLES + [
    ("llama", [[2, 16]], "int64", "layers"),
    ("pipelining", [[8, 16]], "int64", "layers"),
]


@pytest.mark.parametrize("name,shapes,dtype,container", WEIGHT_INPUT_EXAMPLES)
def test_bwd_weight_input_bytes_are_what_the_split_records(tmp_path, name, shapes, dtype, container):
    """The exporter's ``bwd_weight_input_bytes`` (read off the recorded forward: the outputs of
    each op on the input path that reads a trainable parameter) against the dx/dw split itself:
    each region module re-run alone on a copy of its input that needs a gradient, its dx run by
    ``backward_input``, the distinct storages of the gradients it records for the dw counted;
    and its ``replay_weight_bytes`` (what those ops saved) against what a session still holds
    once its dx has released the rest, measured as ``python -m hp_recompute.costs`` does."""
    from hp_recompute.backward_split import SPLIT_SUPPORTED, backward_input
    from hp_recompute.costs import _checkpoint_bytes
    if not SPLIT_SUPPORTED:
        pytest.skip("torch < 2.2: W re-walks from the outputs and I records nothing (hpr.split.rewalk-old-torch)")
    if name == "llama" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        pytest.skip("examples/llama needs SDPA (torch >= 2.0)")
    model = hexport.load_factory(os.path.join(ROOT, "examples", name, "model.py") + ":build")
    dtypes = hexport.parse_dtypes(dtype, len(shapes))
    sidecar = hexport.export(model, shapes, dtypes, str(tmp_path / f"{name}.pt"))
    by_name = {r["name"]: r for r in sidecar["regions"]}

    inputs = hexport.make_inputs(shapes, dtypes)
    captured = {}
    blocks = getattr(model, container)
    blocks = list(blocks.values()) if isinstance(blocks, torch.nn.ModuleDict) else list(blocks)
    hooks = [b.register_forward_pre_hook(
        lambda m, args, kwargs, i=i: captured.__setitem__(i, (args, kwargs)), with_kwargs=True)
        for i, b in enumerate(blocks)]
    model(*inputs)
    for h in hooks:
        h.remove()
    checked = 0
    for i, block in enumerate(blocks):
        args, kwargs = captured[i]
        if not args[0].requires_grad:  # the model input: a first stage's dx computes nothing
            continue
        x = args[0].detach().clone().requires_grad_(True)
        out = block(x, *args[1:], **kwargs)
        weights = [p for p in block.parameters() if p.requires_grad]
        _, state = backward_input([out], [torch.ones_like(out)], [x], weights)
        recorded = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes()
                    for grads in state.recorded.values() for g in grads if g is not None}
        expected = sum(recorded.values())
        got = by_name[f"{container}.{i}"]["bwd_weight_input_bytes"]
        assert expected > 0
        assert got == expected, (name, i, got, expected)
        # What the dw reads of a replay: the costs tool's count, at the allocator, of what a
        # replay holds after its dx released the rest (hpr.split.release-unread).
        held = _checkpoint_bytes(block, (x.detach().clone().requires_grad_(True),) + tuple(args[1:]), kwargs,
                                 weights)[2]
        got = by_name[f"{container}.{i}"]["replay_weight_bytes"]
        assert 0 < got == held, (name, i, got, held)
        checked += 1
    assert checked >= len(blocks) - 1
