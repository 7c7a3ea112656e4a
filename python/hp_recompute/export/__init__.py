"""The exporter: ``python3 -m hp_recompute.export`` turns an ``nn.Module`` into the planner's
input (docs/models.md). ``cli`` is the command line, ``inputs`` the module and its example
inputs (shared with ``python -m hp_recompute.costs --module``), ``measure`` runs the model once
and measures each region, ``graph`` writes the model JSON of the measured regions, ``ir`` the
TorchScript IR text."""

from .cli import export, main
from .inputs import ExportError, load_factory, make_inputs, parse_dtypes, parse_shapes

__all__ = ["ExportError", "export", "load_factory", "main", "make_inputs", "parse_dtypes", "parse_shapes"]
