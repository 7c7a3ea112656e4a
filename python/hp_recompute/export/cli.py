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
import os
import sys
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..factory import raised_at
from ..output_files import OutputError, check_outputs, text_writer, write_outputs
from .graph import model_graph, segment_json
from .inputs import (ExportError, SelectedOutput, add_module_arguments, check_input_size, check_module_arguments,
                     describe_inputs, load_factory, make_inputs, module_inputs)
from .ir import module_to_ir
from .measure import RegionError, measure_regions

__all__ = ["export", "main"]

SIDECAR_FORMAT = "hp-recompute-export"


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


def export(model: nn.Module, shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype],
           out: str, region_depth: int = 1, ir: Optional[str] = None,
           model_json: Optional[str] = None, name: Optional[str] = None,
           source: str = "", model_output: Optional[str] = None) -> dict:
    """Traces ``model`` and writes ``out`` (.pt, or .pt2 on torch 2.x) plus its sidecar.

    Returns the sidecar dict. A ``.pt2`` is ``torch.export.export`` of the model in
    training mode (dropout and batch statistics stay in the program), saved with
    ``torch.export.save``. ``source`` is the ``FILE.py:FACTORY`` the model came from (its
    file is an input no output may be). ``model_output`` chooses what of the model's output is
    traced and measured (``SelectedOutput``).
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
    with SelectedOutput(model, model_output) as selected:
        try:  # eagerly first: an error here is the model's, on these inputs
            inputs = make_inputs(shapes, dtypes)
            segments = measure_regions(model, inputs, region_depth, name=source or out)
        except ExportError:
            raise
        except RegionError as e:  # the planner's segmentation: repeated region call, no regions
            raise ExportError(f"hp_recompute: {e}") from None
        except BaseException as e:  # noqa: BLE001 - the model's own error for these inputs, SystemExit included
            raise ExportError(f"hp_recompute: the model fails on inputs {described} (--input-shape, "
                              f"--input-dtype): {raised_at(e)}") from None
        if selected.note:
            print(selected.note, file=sys.stderr)
        try:
            tracer = "torch.jit.trace"
            traced = torch.jit.trace(model, inputs, check_trace=False) if ir is not None or not as_program else None
            tracer = "torch.export.export"
            program = torch.export.export(model, tuple(inputs)) if as_program else None
        except ExportError:
            raise
        except BaseException as e:  # noqa: BLE001 - the tracer's error; the model itself ran above
            raise ExportError(f"hp_recompute: {tracer} could not capture the model, which runs eagerly on inputs "
                              f"{described}: {raised_at(e)}") from None
    name = name or os.path.splitext(os.path.basename(out))[0]
    sidecar = {
        "format": SIDECAR_FORMAT,
        "version": 1,
        "name": name,
        "module": source,
        "region_depth": region_depth,
        "inputs": [{"shape": list(s), "dtype": str(d).replace("torch.", "")}
                   for s, d in zip(shapes, dtypes)],
        "regions": [segment_json(s) for s in segments],
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
               args.model_json, args.name, source=args.module, model_output=args.model_output)
    except ExportError as e:
        print(e, file=sys.stderr)
        return 2 if e.usage else 1
    return 0
