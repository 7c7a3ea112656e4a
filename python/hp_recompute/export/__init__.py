"""The exporter: ``python3 -m hp_recompute.export`` turns an ``nn.Module`` into the planner's
input (docs/models.md). ``cli`` is the command line, ``measure`` runs the model once and
measures each region, ``ir`` writes the TorchScript IR text."""

from .cli import ExportError, export, load_factory, main, make_inputs, parse_dtypes, parse_shapes

__all__ = ["ExportError", "export", "load_factory", "main", "make_inputs", "parse_dtypes", "parse_shapes"]
