"""Export an ``nn.Module`` for hp-recompute's planner: ``python3 -m hp_recompute.export``.

Why: the planner (C++) reads TorchScript and torch.export programs; it cannot
run Python factories. This tool builds the module from ``FILE.py:FACTORY``,
traces or exports it, and writes

* ``OUT.pt``    - the traced TorchScript archive (``torch.jit.save``), or with
  ``-o OUT.pt2`` (torch 2.x) the ``torch.export`` program (``torch.export.save``),
  which the planner reads without LibTorch;
* ``OUT.json``  - the sidecar: inputs, region depth, and per region the shapes
  and costs measured on the eager model (``export/measure.py``), notably
  ``saved_bytes`` from ``torch.autograd.graph.saved_tensors_hooks``;
* optionally ``--ir OUT.ir`` (IR text, ``export/ir.py``) and ``--model-json
  FILE`` (the model JSON graph format, docs/models.md).

Example::

    python3 -m hp_recompute.export --module examples/gpt/model.py:build \\
        --input-shape 4x40 --input-dtype int64 -o examples/gpt/gpt.pt
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..errors import HPRecomputeError, RunError
from ..factory import call_factory, raised_at
from ..native import planner_extension
from ..output_files import OutputError, check_outputs, text_writer, write_outputs
from .ir import module_to_ir
from .measure import RegionError, Segment, measure_regions

__all__ = ["ExportError", "parse_shapes", "parse_dtypes", "load_factory", "export", "main",
           "add_module_arguments", "check_module_arguments", "module_inputs", "model_graph"]

SIDECAR_FORMAT = "hp-recompute-export"
MODEL_FORMAT = "hp-recompute-model"

class ExportError(RuntimeError, HPRecomputeError):
    """A user error; the message starts with ``hp_recompute:`` and says how to fix it.
    ``usage``: a usage error (exit 2), such as an output that is an input."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


def _planner() -> Any:
    """The planner extension, which parses the input flags and prices the ops (measure.py);
    missing, an ``ExportError`` before any model runs."""
    try:
        return planner_extension()
    except RunError as e:
        raise ExportError(str(e)) from None


def parse_shapes(text: str) -> List[List[int]]:
    """``"4x40x48,4x40"`` -> ``[[4, 40, 48], [4, 40]]``: the C++ CLI's own parser, through the bindings."""
    try:
        return _planner().parse_shape_list(text)
    except ValueError as e:
        raise ExportError(f"hp_recompute: {e}") from None


def parse_dtypes(text: str, count: int) -> List[torch.dtype]:
    """One dtype for all ``count`` inputs or one per input, by PyTorch name (the C++ CLI's parser)."""
    try:
        names = _planner().parse_dtype_list(text, count)
    except ValueError as e:
        raise ExportError(f"hp_recompute: {e}") from None
    return [getattr(torch, name) for name in names]


def load_factory(spec: str) -> nn.Module:
    """Imports ``FILE.py:FACTORY`` and returns ``FACTORY()`` (an ``nn.Module``)."""
    model = call_factory(spec, "hp_recompute: --module", ExportError)
    factory = spec.rpartition(":")[2]
    if not isinstance(model, nn.Module):
        raise ExportError(f"hp_recompute: --module: {factory}() returned "
                          f"{type(model).__name__}, expected an nn.Module")
    return model


def make_inputs(shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype],
                seed: int = 0) -> Tuple[torch.Tensor, ...]:
    """Deterministic example inputs: N(0,1) floats, zeros for integers (valid indices)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        if dtype.is_floating_point:
            out.append(torch.randn(*shape, generator=gen).to(dtype))
        else:
            out.append(torch.zeros(*shape, dtype=dtype))
    return tuple(out)


def _segment_json(seg: Segment) -> dict:
    return {
        "name": seg.name,
        "checkpointable": seg.checkpointable,
        "saved_bytes": sum(seg.saved.values()),
        "input_bytes": sum(seg.inputs.values()),
        "param_bytes": sum(seg.params.values()),
        **_tied_params(seg),
        "fwd_flops": seg.flops,
        "input_shapes": seg.input_shapes,
        "output_shapes": seg.output_shapes,
    }


def _tied_params(seg: Segment) -> dict:
    """The ``tied_params`` member of ``seg``'s region (docs/models.md): none when it shares no
    parameter with another region."""
    if not seg.tied:
        return {}
    return {"tied_params": [{"name": name, "bytes": nbytes} for name, nbytes in seg.tied.items()]}


def model_graph(name: str, segments: Sequence[Segment]) -> dict:
    """The model JSON graph (docs/models.md) of measured ``segments``: the planner's input,
    without times (``python -m hp_recompute.costs --module`` adds them)."""
    regions = [_segment_json(s) for s in segments]
    return {"format": MODEL_FORMAT, "version": 1, "name": name, "regions": [
        {"name": r["name"], "checkpoint": False, "checkpointable": r["checkpointable"],
         "fwd_flops": int(r["fwd_flops"]), "fwd_time_us": 0,
         "saved_bytes": r["saved_bytes"], "input_bytes": r["input_bytes"],
         "param_bytes": r["param_bytes"], **_tied_params(s)} for r, s in zip(regions, segments)]}


#: Largest example input the exporter builds (elements over all inputs): 2^31.
MAX_INPUT_ELEMENTS = 1 << 31


#: Deepest --region-depth (module nesting below the root).
MAX_REGION_DEPTH = 64


def check_files(out: str, ir: Optional[str], model_json: Optional[str], source: str) -> None:
    """Refuses, before any work, outputs that could not or must not be written (NOTE [ Output
    files ] in output_files.py), e.g. ``--model-json`` equal to the sidecar or to the file of
    ``source`` (``FILE.py:FACTORY``)."""
    outputs = [("-o", out), ("the sidecar", sidecar_of(out))] + ([("--ir", ir)] if ir is not None else []) \
        + ([("--model-json", model_json)] if model_json is not None else [])
    module_file = source.rpartition(":")[0]
    try:
        check_outputs(outputs, [("--module", module_file)] if module_file else [])
    except OutputError as e:
        raise ExportError(f"hp_recompute: {e}", usage=e.usage) from None


def sidecar_of(out: str) -> str:
    """The sidecar beside ``OUT.pt``/``OUT.pt2``: ``OUT.json``."""
    return os.path.splitext(out)[0] + ".json"


def check_input_size(shapes: Sequence[Sequence[int]]) -> None:
    """Refuses example inputs of more than ``MAX_INPUT_ELEMENTS`` elements in all."""
    elements = sum(math.prod(shape) for shape in shapes)
    if elements > MAX_INPUT_ELEMENTS:
        raise ExportError(f"hp_recompute: --input-shape: {elements} elements in all; at most "
                          f"{MAX_INPUT_ELEMENTS} are built")


def describe_inputs(shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype]) -> str:
    """``"4x40 int64"``: the inputs as the flags name them, for messages."""
    return ", ".join("x".join(map(str, s)) + f" {str(d).replace('torch.', '')}" for s, d in zip(shapes, dtypes))


# ---------------------------------------------------------------------------
# The module flags, shared by the exporter and ``python -m hp_recompute.costs --module``
# ---------------------------------------------------------------------------

def add_module_arguments(parser: argparse.ArgumentParser, required: bool) -> None:
    """Adds ``--module``, ``--input-shape``, ``--input-dtype`` and ``--region-depth``.

    Args:
        required: ``--module`` is required (the exporter); otherwise it selects a mode and
            ``check_module_arguments`` requires ``--input-shape`` with it.
    """
    parser.add_argument("--module", required=required, metavar="FILE.py:FACTORY",
                        help="FILE.py:FACTORY returning an nn.Module")
    parser.add_argument("--input-shape", required=required, help="e.g. 4x40x48 or 4x40x48,4x40")
    parser.add_argument("--input-dtype", default="float32", help="one dtype or one per input")
    parser.add_argument("--region-depth", type=int, default=1,
                        help=f"module nesting of the regions, 1 to {MAX_REGION_DEPTH} (default 1)")


def check_module_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors (exit 2) of the module flags: a depth out of range, ``--input-shape``
    missing with ``--module``."""
    if not 1 <= args.region_depth <= MAX_REGION_DEPTH:
        parser.error(f"--region-depth must be in [1, {MAX_REGION_DEPTH}], got {args.region_depth}")
    if args.module is not None and args.input_shape is None:
        parser.error("--module needs --input-shape (the example inputs the module is run on)")


def module_inputs(args: argparse.Namespace) -> Tuple[List[List[int]], List[torch.dtype]]:
    """The shapes and dtypes of ``--input-shape`` / ``--input-dtype`` (``ExportError`` if bad)."""
    shapes = parse_shapes(args.input_shape)
    dtypes = parse_dtypes(args.input_dtype, len(shapes))
    check_input_size(shapes)
    return shapes, dtypes


def export(model: nn.Module, shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype],
           out: str, region_depth: int = 1, ir: Optional[str] = None,
           model_json: Optional[str] = None, name: Optional[str] = None,
           source: str = "") -> dict:
    """Traces ``model`` and writes ``out`` (.pt, or .pt2 on torch 2.x) plus its sidecar.

    Returns the sidecar dict. A ``.pt2`` is ``torch.export.export`` of the model in
    training mode (dropout and batch statistics stay in the program), saved with
    ``torch.export.save``. ``source`` is the ``FILE.py:FACTORY`` the model came from (its
    file is an input no output may be).
    """
    as_program = out.endswith(".pt2")
    if as_program and not hasattr(torch, "export"):
        raise ExportError(f"hp_recompute: -o {out}: writing .pt2 needs torch.export (torch 2.x); "
                          f"this is torch {torch.__version__}; write a .pt instead")
    sidecar_path = sidecar_of(out)
    check_files(out, ir, model_json, source)
    check_input_size(shapes)
    model.train()
    described = describe_inputs(shapes, dtypes)
    try:
        inputs = make_inputs(shapes, dtypes)
        traced = torch.jit.trace(model, inputs, check_trace=False) if ir is not None or not as_program else None
        program = torch.export.export(model, tuple(inputs)) if as_program else None
        segments = measure_regions(model, inputs, region_depth, name=source or out)
    except ExportError:
        raise
    except RegionError as e:  # the planner's segmentation: repeated region call, no regions
        raise ExportError(f"hp_recompute: {e}") from None
    except BaseException as e:  # noqa: BLE001 - the model's own error for these inputs, SystemExit included
        raise ExportError(f"hp_recompute: the model fails on inputs {described} (--input-shape, "
                          f"--input-dtype): {raised_at(e)}") from None
    name = name or os.path.splitext(os.path.basename(out))[0]
    sidecar = {
        "format": SIDECAR_FORMAT,
        "version": 1,
        "name": name,
        "module": source,
        "region_depth": region_depth,
        "inputs": [{"shape": list(s), "dtype": str(d).replace("torch.", "")}
                   for s, d in zip(shapes, dtypes)],
        "regions": [_segment_json(s) for s in segments],
    }

    # Each writer fills a file object (write_outputs' temporary, or a device as it is); through
    # a file object an archive's root folder is "archive", not the temporary file's name.
    def save_program(f: Any) -> None:
        torch.export.save(program, f)

    def save_traced(f: Any) -> None:
        torch.jit.save(traced, f)

    def json_text(value: Any) -> Any:
        return text_writer(json.dumps(value, indent=2) + "\n")

    files: List[Tuple[str, str, Any]] = [("-o", out, save_program if as_program else save_traced),
                                         ("the sidecar", sidecar_path, json_text(sidecar))]
    if ir is not None:
        files.append(("--ir", ir, text_writer(module_to_ir(traced, model))))
    if model_json is not None:
        files.append(("--model-json", model_json, json_text(model_graph(name, segments))))
    try:
        write_outputs(files)
    except OutputError as e:
        raise ExportError(f"hp_recompute: {e}") from None
    return sidecar


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 1 bad input, 2 usage)."""
    parser = argparse.ArgumentParser(prog="python3 -m hp_recompute.export",
                                     description=__doc__.split("\n\n")[0])
    add_module_arguments(parser, required=True)
    parser.add_argument("-o", "--output", required=True,
                        help="OUT.pt (TorchScript) or OUT.pt2 (torch.export, torch 2.x); "
                             "sidecar: OUT.json")
    parser.add_argument("--ir", help="also write TorchScript IR text here (- for stdout)")
    parser.add_argument("--model-json", help="also write the model JSON graph here (- for stdout)")
    parser.add_argument("--name", help="model name (default: OUT's stem)")
    args = parser.parse_args(argv)
    check_module_arguments(parser, args)
    try:
        if not args.output.endswith((".pt", ".pt2")):
            raise ExportError(f"hp_recompute: -o: expected a path ending in .pt or .pt2, got "
                              f"'{args.output}'")
        shapes, dtypes = module_inputs(args)
        check_files(args.output, args.ir, args.model_json, args.module)  # before the factory runs
        model = load_factory(args.module)
        export(model, shapes, dtypes, args.output, args.region_depth, args.ir,
               args.model_json, args.name, source=args.module)
    except ExportError as e:
        print(e, file=sys.stderr)
        return 2 if e.usage else 1
    return 0
