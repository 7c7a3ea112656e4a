"""A user's module and its example inputs, as the exporter and ``python -m hp_recompute.costs --module`` take them.

Both tools name a module by ``FILE.py:FACTORY`` and its inputs by ``--input-shape`` /
``--input-dtype`` (parsed by the C++ CLI's own parsers, through the planner extension),
and run it on deterministic example inputs; the flags, their checks and the factory call
live here, once, below both command lines.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..errors import HPRecomputeError, RunError
from ..factory import call_factory
from ..native import planner_extension

__all__ = ["ExportError", "MAX_REGION_DEPTH", "SelectedOutput", "add_module_arguments", "check_input_size",
           "check_module_arguments", "describe_inputs", "load_factory", "make_inputs", "module_inputs",
           "parse_dtypes", "parse_shapes"]


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


#: Largest example input the exporter builds (elements over all inputs): 2^31.
MAX_INPUT_ELEMENTS = 1 << 31


#: Deepest --region-depth (module nesting below the root).
MAX_REGION_DEPTH = 64


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
    """Adds ``--module``, ``--input-shape``, ``--input-dtype``, ``--region-depth`` and ``--model-output``.

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
    parser.add_argument("--model-output", default=None, metavar="FIELD",
                        help="the model's output to trace and measure when it returns several: a key of a "
                             "ModelOutput or dict (logits) or a tuple index (default: all of them when they are "
                             "tensors, else the first tensor)")


def _first_tensor(output: Any) -> Tuple[str, Optional[torch.Tensor]]:
    """The first tensor of a model's output and where it is (``'logits'``, ``[0]``)."""
    from torch.utils._pytree import tree_flatten

    if isinstance(output, Mapping):  # a ModelOutput or dict: by key, in order
        for key, value in output.items():
            if isinstance(value, torch.Tensor):
                return f"'{key}'", value
        return "", None
    for index, value in enumerate(output if isinstance(output, (tuple, list)) else ()):
        if isinstance(value, torch.Tensor):
            return f"[{index}]", value
    leaves = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
    return ("its first tensor", leaves[0]) if leaves else ("", None)


def _only_tensors(output: Any) -> bool:
    """A tensor, or tuples and lists of only tensors: what tracing and export take as is."""
    if isinstance(output, torch.Tensor):
        return True
    return type(output) in (tuple, list) and all(_only_tensors(o) for o in output)


def _field(output: Any, field: str) -> Optional[torch.Tensor]:
    """The tensor ``field`` names in ``output``: a key of a ModelOutput or dict, an index of a tuple."""
    if isinstance(output, Mapping):
        value = output.get(field)
    elif isinstance(output, (tuple, list)) and field.lstrip("-").isdigit() and -len(output) <= int(field) < len(output):
        value = output[int(field)]
    else:
        value = getattr(output, field, None)
    return value if isinstance(value, torch.Tensor) else None


class SelectedOutput:
    """``model``'s forward returning one tensor of its output while the context is open
    (``--model-output``): ``field`` (a key of a ModelOutput or dict, a tuple index), or, given
    None, the output as it is when it is only tensors and else its first tensor (a Hugging
    Face ``CausalLMOutputWithPast``: its ``logits``; its cache is no tensor). ``note``
    says what was chosen where it was not the output as it is."""

    def __init__(self, model: nn.Module, field: Optional[str]) -> None:
        self.model, self.field, self.note = model, field, ""
        self._had, self._forward = False, None  # the instance's own forward, restored on exit

    def _select(self, output: Any) -> Any:
        if self.field is not None:
            value = _field(output, self.field)
            if value is None:
                tensors = [k for k, v in output.items() if isinstance(v, torch.Tensor)] \
                    if isinstance(output, Mapping) else []
                raise ExportError(f"hp_recompute: --model-output {self.field}: the model's output "
                                  f"({type(output).__name__}) has no tensor '{self.field}'"
                                  + (f"; its tensors: {', '.join(tensors)}" if tensors else ""))
            return value
        if _only_tensors(output):
            return output
        where, value = _first_tensor(output)
        if value is None:
            raise ExportError(f"hp_recompute: the model's output ({type(output).__name__}) holds no tensor; return "
                              f"one, or choose one with --model-output")
        if not self.note:
            self.note = (f"hp_recompute: the model returns {type(output).__name__}; using its "
                         f"tensor {where} (--model-output chooses another)")
        return value

    def apply(self) -> "SelectedOutput":
        """Patches the forward (for a model the caller owns to the end: the tools' own)."""
        forward = self.model.forward
        self._had = "forward" in self.model.__dict__
        self._forward = self.model.__dict__.get("forward")

        def selected(*args: Any, **kwargs: Any) -> Any:
            return self._select(forward(*args, **kwargs))

        self.model.forward = selected  # type: ignore[method-assign]
        return self

    def __enter__(self) -> "SelectedOutput":
        return self.apply()

    def __exit__(self, *exc: Any) -> None:
        if self._had:
            self.model.forward = self._forward  # type: ignore[method-assign]
        else:
            del self.model.forward


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
