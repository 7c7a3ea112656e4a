"""``python -m hp_recompute.costs --module``: a plain nn.Module measured with no adapter.

Oracles: the runner-region path (``--model-json``, the runner's hand-written adapters) measures
the same bundled models through other code (region functions, not a cut forward), so the
bytes both write must agree; the exporter's model JSON names the same segments; the planner
plans the result; and a real 2-rank run's allocator peak is within 10% of the planned peak.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Dict

import pytest
import torch

from cli_processes import run_module
from hpr_run_util import GPT_MODEL_JSON, REPO, flags, make_plan, run_cli, run_costs
from hp_recompute.selective import selective_supported

GPT = str(REPO / "examples" / "gpt" / "model.py")
MLP = str(REPO / "examples" / "mlp" / "model.py")
LLAMA = str(REPO / "examples" / "llama" / "model.py")
HAS_SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention")
needs_sdpa = pytest.mark.skipif(not HAS_SDPA, reason=f"the Llama uses F.scaled_dot_product_attention (torch >= 2.0); "
                                                     f"this is torch {torch.__version__}")

#: Per model: --module, input flags (the runner's microbatch), the runner's --model (None: the
#: default GPT), an even 2-stage split (the planner's balanced split follows the measured
#: times, which vary from run to run).
MODELS = {
    "gpt": (f"{GPT}:build", ["--input-shape", "4x40", "--input-dtype", "int64"], None, "0:0-4,1:5-9"),
    "mlp": (f"{MLP}:build", ["--input-shape", "8x32"], f"{MLP}:pipeline", "0:0-8,1:9-17"),
    "llama": (f"{LLAMA}:build", ["--input-shape", "2x64", "--input-dtype", "int64"], f"{LLAMA}:pipeline",
              "0:0-2,1:3-5"),
}
QUICK = ["--repeats", "2", "--warmup", "1"]


def _measure(out: Path, model: str, *extra: str) -> Dict:
    module, inputs, _, _ = MODELS[model]
    proc = run_costs("--module", module, *inputs, "-o", str(out), *QUICK, *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def _refused(proc: subprocess.CompletedProcess, code: int, message: str, out: Path) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists()


def test_a_plain_module_gets_the_adapters_bytes_and_plans(tmp_path: Path) -> None:
    """The bundled GPT through --module (a cut forward) and through its runner adapter
    (--model-json): same segments, the same bytes I keeps for W and the same backward
    workspace, every time measured; the planner plans it."""
    cut = _measure(tmp_path / "cut.json", "gpt")
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "-o", str(tmp_path / "adapter.json"), *QUICK)
    assert proc.returncode == 0, proc.stderr
    adapter = json.loads((tmp_path / "adapter.json").read_text())
    assert [r["name"] for r in cut["regions"]] == [r["name"] for r in adapter["regions"]]
    for mine, theirs in zip(cut["regions"], adapter["regions"]):
        for key in ("input_bytes", "param_bytes", "bwd_weight_input_bytes"):
            assert mine[key] == theirs[key], (mine["name"], key, mine[key], theirs[key])
        # The adapter's last region returns the loss, whose 4-byte seed gradient autograd
        # allocates inside the measured backward; the cut forward seeds the loss from outside.
        assert 0 <= theirs["bwd_workspace_bytes"] - mine["bwd_workspace_bytes"] <= 4, mine["name"]
        # The exported JSON was written on another torch: eager Python's 8-byte scale (docs/models.md).
        assert abs(mine["saved_bytes"] - theirs["saved_bytes"]) <= 8
        assert mine["fwd_time_us"] > 0 and mine["bwd_time_us"] > 0 and mine["bwd_weight_time_us"] > 0
        if mine["checkpointable"]:
            assert mine["bwd_input_time_us"] > 0 and mine["replay_time_us"] > 0 and mine["checkpoint_fwd_time_us"] > 0
            # A checkpoint keeps the CPU generator's state to replay with (preserve_rng_state).
            assert mine["checkpoint_state_bytes"] == theirs["checkpoint_state_bytes"] >= torch.get_rng_state().numel()
            # A replay allocates what the forward saved but the input it kept.
            assert mine["replay_bytes"] == theirs["replay_bytes"]
            assert mine["saved_bytes"] - mine["input_bytes"] <= mine["replay_bytes"] <= mine["saved_bytes"]
        else:
            assert not {"checkpoint_state_bytes", "replay_bytes"} & (set(mine) | set(theirs))
    assert "torch " + torch.__version__ in cut["source"]
    # The module returns the logits, which the loss outside it reads: the last region carries their
    # bytes (4 x 40 tokens x the vocabulary, float32), the adapter's, which returns the loss, none.
    spec = importlib.util.spec_from_file_location("hpr_test_gpt", GPT)
    gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpt)
    logits = gpt.build()(torch.zeros(4, 40, dtype=torch.int64))
    logits_bytes = logits.numel() * logits.element_size()
    assert cut["regions"][-1]["output_bytes"] == logits_bytes
    assert not any("output_bytes" in r for r in cut["regions"][:-1] + adapter["regions"])
    plan = json.loads(make_plan(tmp_path, "--model", str(tmp_path / "cut.json"), "--checkpoint", "all",
                                *flags(("1f1b", 2, 4))).read_text())
    planned = {r["name"]: r for s in plan["model"]["stages"] for r in s["regions"]}
    assert planned[cut["regions"][-1]["name"]]["output_bytes"] == logits_bytes
    assert sorted(planned) == sorted(r["name"] for r in cut["regions"])
    assert all(planned[n]["checkpoint"] == r["checkpointable"] for n, r in
               ((r["name"], r) for r in cut["regions"]))


def test_the_segments_are_the_exporters(tmp_path: Path) -> None:
    """Region names and byte counts are those the exporter writes for the same module (one
    segmentation, segmentOps, through both)."""
    cut = _measure(tmp_path / "cut.json", "mlp")
    proc = run_module("hp_recompute.export", ["--module", f"{MLP}:build", "--input-shape", "8x32", "-o",
                                              str(tmp_path / "mlp.pt"), "--model-json",
                                              str(tmp_path / "mlp.model.json")])
    assert proc.returncode == 0, proc.stderr
    exported = json.loads((tmp_path / "mlp.model.json").read_text())
    keys = ("name", "checkpointable", "fwd_flops", "saved_bytes", "input_bytes", "param_bytes")
    assert [{k: r[k] for k in keys} for r in cut["regions"]] == [{k: r[k] for k in keys} for r in exported["regions"]]


@needs_sdpa
def test_a_torchtitan_style_llama_is_costed_without_an_adapter(tmp_path: Path) -> None:
    graph = _measure(tmp_path / "llama.json", "llama")
    names = [r["name"] for r in graph["regions"]]
    assert names == ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm+output"]
    layers = [r for r in graph["regions"] if r["checkpointable"]]
    # What crosses a stage boundary between layers: one [2, 64, 64] float32 activation
    # (freqs_cis is a buffer: param_bytes).
    assert all(r["input_bytes"] == 2 * 64 * 64 * 4 for r in layers)
    assert all(r["saved_bytes"] > 4 * r["input_bytes"] for r in layers)
    # --regions layers (a ModuleDict: its children) is the default rule's choice here.
    chosen = _measure(tmp_path / "chosen.json", "llama", "--regions", "layers")
    assert [r["name"] for r in chosen["regions"]] == names
    assert [r["saved_bytes"] for r in chosen["regions"]] == [r["saved_bytes"] for r in graph["regions"]]


@pytest.mark.skipif(HAS_SDPA, reason="checks the refusal on a torch without F.scaled_dot_product_attention")
def test_the_llama_refuses_a_torch_without_sdpa(tmp_path: Path) -> None:
    out = tmp_path / "llama.json"
    module, inputs, _, _ = MODELS["llama"]
    proc = run_costs("--module", module, *inputs, "-o", str(out), *QUICK)
    _refused(proc, 1, "needs F.scaled_dot_product_attention (torch >= 2.0)", out)


def test_regions_chosen_by_path(tmp_path: Path) -> None:
    """--regions names the regions; the code between them is named as segmentOps names code
    outside regions (after the top-level module calls it makes)."""
    graph = _measure(tmp_path / "mlp.json", "mlp", "--regions", "layers.0,layers.2")
    assert [(r["name"], r["checkpointable"]) for r in graph["regions"]] == [
        ("inp", False), ("layers.0", True), ("layers.1", False), ("layers.2", True),
        ("+".join(f"layers.{i}" for i in range(3, 16)) + "+head", False)]
    every = _measure(tmp_path / "every.json", "mlp", "--regions", "layers.*")
    default = _measure(tmp_path / "default.json", "mlp")
    assert [r["name"] for r in every["regions"]] == [r["name"] for r in default["regions"]]


def _model_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "m.py"
    path.write_text("import torch\nimport torch.nn as nn\n" + body)
    return str(path)


FLAT = """
class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
def build():
    return Flat()
def broken():
    raise ValueError("no weights here")
def not_a_module():
    return 3
"""


TIED = """
class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(16, 64, bias=False)
        self.head.weight = self.embed.weight
    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)
def build():
    return Tied()
"""


def test_a_tied_weight_is_listed_by_each_region_and_planned_once_per_stage(tmp_path: Path) -> None:
    """An embedding tied to the head: both regions count the weight in param_bytes and list it
    in tied_params, so the planner holds it once in a stage that has both (the distinct bytes
    of the model's parameters) and once per stage when they are apart."""
    module = _model_file(tmp_path, TIED)
    out = tmp_path / "tied.json"
    proc = run_costs("--module", f"{module}:build", "--input-shape", "2x8", "--input-dtype", "int64", "-o", str(out),
                  *QUICK)
    assert proc.returncode == 0, proc.stderr
    regions = json.loads(out.read_text())["regions"]
    spec = importlib.util.spec_from_file_location("tied_model", module)
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    model = source.build()
    distinct = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied weight once
    weight = model.embed.weight.numel() * model.embed.weight.element_size()
    assert [r["name"] for r in regions] == ["embed", "layers.0", "layers.1", "head"]
    assert [r.get("tied_params") for r in regions] == [[{"name": "embed.weight", "bytes": weight}], None, None,
                                                       [{"name": "embed.weight", "bytes": weight}]]
    assert sum(r["param_bytes"] for r in regions) == distinct + weight
    for ranks, stages, held in ((1, "0:0-3", distinct), (2, "0:0-1,1:2-3", distinct + weight)):
        plan = json.loads(make_plan(tmp_path, "--model", str(out), "--stages", stages,
                                    *flags(("1f1b", ranks, 2))).read_text())
        assert sum(r["param_bytes"] for s in plan["model"]["stages"] for r in s["regions"]) == held, stages


@pytest.mark.parametrize("case,extra,message", [
    ("no colon", ["--module", "model.py"], "hp_recompute: --module: expected FILE.py:FACTORY, got 'model.py'"),
    ("no file", ["--module", "missing.py:build"], "hp_recompute: --module: no such file 'missing.py'"),
    ("no factory", ["--module", "{m}:nothing"], "has no callable 'nothing'"),
    ("factory raises", ["--module", "{m}:broken"], "broken() in '{m}' raised ValueError: no weights here"),
    ("not a module", ["--module", "{m}:not_a_module"], "not_a_module() returned int, expected an nn.Module"),
    ("no repeated children", ["--module", "{m}:build"],
     "no regions at region depth 1: the model calls no element of a ModuleList/Sequential that deep "
     "(submodule calls: a, b)"),
    ("no such region", ["--module", "{m}:build", "--regions", "a,c"],
     "hp_recompute.costs: --regions: 'c' is no submodule of Flat (its top-level submodules: a, b, unused)"),
    ("region runs nothing", ["--module", "{m}:build", "--regions", "a,unused"],
     ":build: module 'unused' runs no op in the forward, so it is no region"),
    ("nested region", ["--module", f"{MLP}:build", "--regions", "layers.0,layers.0.fc1"],
     "region 'layers.0.fc1' is inside region 'layers.0'; a region is one module's call"),
    ("region twice", ["--module", f"{MLP}:build", "--regions", "layers.1,layers.1"], "region 'layers.1' is named twice"),
    ("bad shape", ["--module", "{m}:build", "--input-shape", "4xfoo"], "hp_recompute: "),
    ("model fails", ["--module", "{m}:build", "--input-shape", "4x5"],
     "hp_recompute.costs: measuring {m}:build on inputs 4x5 float32 (--input-shape, --input-dtype) failed: "
     "RuntimeError"),
])
def test_bad_input_is_refused_with_exit_1(tmp_path: Path, case: str, extra, message: str) -> None:
    m = _model_file(tmp_path, FLAT)
    out = tmp_path / "out.json"
    args = [a.format(m=m) for a in extra]
    if "--input-shape" not in args:
        args += ["--input-shape", "4x4" if m in " ".join(args) else "8x32"]
    proc = run_costs(*args, "-o", str(out), *QUICK, cwd=tmp_path)
    _refused(proc, 1, message.format(m=m), out)


def test_regions_choose_modules_that_the_depth_rule_does_not(tmp_path: Path) -> None:
    """The model without repeated children above: --regions a,b makes each Linear a region."""
    m = _model_file(tmp_path, FLAT)
    out = tmp_path / "out.json"
    proc = run_costs("--module", f"{m}:build", "--input-shape", "4x4", "--regions", "a,b", "-o", str(out), *QUICK)
    assert proc.returncode == 0, proc.stderr
    graph = json.loads(out.read_text())
    assert [(r["name"], r["checkpointable"]) for r in graph["regions"]] == [("a", True), ("top", False), ("b", True)]


def test_processes_measure_the_module_in_as_many_processes(tmp_path: Path) -> None:
    """--processes with --module: the same regions and bytes as one process, the times taken
    in two processes at once (the source says so)."""
    m = _model_file(tmp_path, FLAT)
    graphs = []
    for processes in ("1", "2"):
        out = tmp_path / f"out{processes}.json"
        proc = run_costs("--module", f"{m}:build", "--input-shape", "4x4", "--regions", "a,b", "--processes", processes,
                      "-o", str(out), *QUICK)
        assert proc.returncode == 0, proc.stderr
        graphs.append(json.loads(out.read_text()))
    assert "1 thread(s) x 2 process(es)" in graphs[1]["source"]
    for one, two in zip(graphs[0]["regions"], graphs[1]["regions"]):
        assert one["name"] == two["name"]
        assert {k: v for k, v in one.items() if k.endswith("_bytes")} == \
            {k: v for k, v in two.items() if k.endswith("_bytes")}
        assert two["fwd_time_us"] > 0


KEEPS_STATE = """
class Cached(nn.Module):
    def __init__(self):
        super().__init__()
        self.kept = []
        self.lin = nn.Linear(4, 4)
    def forward(self, x):
        y = self.lin(x)
        self.kept.append(y.detach().clone())  # state kept between calls, as a KV cache
        return y
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Cached()
        self.b = nn.Linear(4, 4)
    def forward(self, x):
        return self.b(self.a(x))
def build():
    return Model()
"""


def test_a_region_keeping_state_between_calls_is_refused(tmp_path: Path) -> None:
    """hpr.cut.stateless-regions: its bytes would grow with every measured call (a Hugging Face
    model with use_cache=True is tested in test/python/hf, where the message names use_cache)."""
    m = _model_file(tmp_path, KEEPS_STATE)
    out = tmp_path / "out.json"
    proc = run_costs("--module", f"{m}:build", "--input-shape", "4x4", "--regions", "a,b", "-o", str(out), *QUICK)
    _refused(proc, 1, "hp_recompute.costs: region 'a' keeps 64 bytes beyond its outputs after each call (two calls "
                      "without grad): its forward keeps state between calls", out)
    assert "make the forward leave nothing behind" in proc.stderr


@pytest.mark.parametrize("args,message", [
    ([], "give either --module FILE.py:FACTORY"),
    (["--module", f"{GPT}:build"], "--module needs --input-shape"),
    (["--module", f"{GPT}:build", "--input-shape", "4x40", "--model-json", str(GPT_MODEL_JSON)],
     "give either --module"),
    (["--model-json", str(GPT_MODEL_JSON), "--regions", "blocks"], "--regions, --input-shape, --input-dtype, "
                                                                   "--region-depth and --autocast go with --module"),
    (["--module", f"{GPT}:build", "--input-shape", "4x40", "--from-run", "r.json"],
     "--from-run goes with --model-json"),
    (["--module", f"{GPT}:build", "--input-shape", "4x40", "--region-depth", "0"], "--region-depth must be in [1, 64]"),
    (["--module", f"{GPT}:build", "--input-shape", "4x40", "--regions", ""], "--regions: an empty value"),
    (["--module", f"{GPT}:build", "--input-shape", "4x40", "--regions", "blocks", "--region-depth", "2"],
     "give one of the two"),
])
def test_usage_errors_exit_2(tmp_path: Path, args, message: str) -> None:
    out = tmp_path / "out.json"
    proc = run_costs(*args, "-o", str(out))
    _refused(proc, 2, message, out)


def test_the_output_may_not_be_the_module_file(tmp_path: Path) -> None:
    m = _model_file(tmp_path, FLAT)
    before = Path(m).read_bytes()
    proc = run_costs("--module", f"{m}:build", "--input-shape", "4x4", "-o", m)
    assert proc.returncode == 2, proc.stderr
    assert "is the same file as the input --module" in proc.stderr
    assert Path(m).read_bytes() == before


# ---------------------------------------------------------------------------
# The criterion: planned peaks within 10% of the allocator in a real 2-rank run
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("model,policy", [
    ("gpt", "all"), ("mlp", "all"), pytest.param("llama", "all", marks=needs_sdpa),
    pytest.param("llama", "selective", marks=[needs_sdpa, pytest.mark.skipif(
        not selective_supported(), reason="selective checkpointing needs torch >= 2.4")])])
def test_planned_peak_of_a_module_costed_without_adapter_is_within_ten_percent(tmp_path: Path, model: str,
                                                                               policy: str) -> None:
    """Costs from --module, a plan that checkpoints every region fully or selectively (1F1B, 2
    ranks x 4, even split), a real run of the runner (2 processes; the runner itself needs
    region functions, so it runs the model's PipelineModel: the bundled adapters,
    examples/llama/model.py:pipeline)."""
    costed = tmp_path / f"{model}.costed.json"
    _measure(costed, model)
    _, _, factory, stages = MODELS[model]
    plan = make_plan(tmp_path, "--model", str(costed), "--checkpoint", policy, "--stages", stages,
                     *flags(("1f1b", 2, 4)))
    report_path = tmp_path / "r.json"
    proc = run_cli("--plan", str(plan), "--steps", "2", "--report", str(report_path),
                   *(["--model", factory] if factory else []), timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["grads_match"] is True
    for rank in report["ranks"]:
        assert abs(rank["measured_over_planned"] - 1) <= 0.10, rank


@pytest.mark.skipif(not __import__("hp_recompute").compile_split.SUPPORTED,
                    reason="the compiled dx/dw split needs torch >= 2.13")
def test_the_runner_runs_a_zbv_plan_on_compiled_llama_blocks(tmp_path: Path) -> None:
    """The runner (2 processes) on the Llama example with every block compiled in place by
    ``compile_backend("aot_eager")`` (``compiled_llama.py``), a ZBV plan with bubble replays on
    its measured costs: the gradients of the runner's reference step (one plain backward of
    the same compiled blocks, no checkpoint, no split), one replay per region per session."""
    costed = tmp_path / "llama.costed.json"
    _measure(costed, "llama")
    plan = make_plan(tmp_path, "--model", str(costed), "--checkpoint", "all", "--prefetch", "bubble",
                     "--stages", "0:0-1,1:2-2,2:3-3,3:4-5", *flags(("zbv", 2, 4)))
    report_path = tmp_path / "r.json"
    proc = run_cli("--plan", str(plan), "--steps", "2", "--report", str(report_path), "--model",
                   f"{Path(__file__).resolve().parent / 'compiled_llama.py'}:pipeline", timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["grads_match"] is True, report
    assert report["recomputes"] == report["recomputes_expected"] > 0 and report["sessions_left"] == 0


def test_autocast_measures_the_forwards_in_the_precision_they_train_in(tmp_path: Path) -> None:
    """``--autocast bfloat16``: the forwards run under torch.autocast, so every activation a
    block of the MLP keeps, replays or hands W is bfloat16, half its float32 bytes; the flag
    is the source line's; with --model-json it is a usage error."""
    fp32 = _measure(tmp_path / "fp32.json", "mlp")
    bf16 = _measure(tmp_path / "bf16.json", "mlp", "--autocast", "bfloat16")
    keys = ["input_bytes", "replay_bytes", "bwd_weight_input_bytes"] + (["selective_saved_bytes"]
                                                                       if selective_supported() else [])
    blocks = [(a, b) for a, b in zip(fp32["regions"], bf16["regions"]) if a["name"].startswith("layers.")][1:]
    assert blocks
    for a, b in blocks:  # the first block's input is the float32 model input
        for key in keys:
            assert b[key] * 2 == a[key], (a["name"], key, a[key], b[key])
    assert "--autocast bfloat16" in json.dumps(bf16)
    proc = run_costs("--model-json", str(GPT_MODEL_JSON), "--autocast", "bfloat16", "-o", str(tmp_path / "x.json"))
    _refused(proc, 2, "--regions, --input-shape, --input-dtype, --region-depth and --autocast go with --module",
             tmp_path / "x.json")
