"""The planner's extension module, ``hp_recompute._planner``, loaded once for every layer.

The C++ planner's readers, verifier, cost rules and parsers reach Python only through it
(nanobind bindings, lib/Bindings/Python), so a checkout without a build or a foreign
platform fails here, with one message, wherever the first caller is.
"""

from __future__ import annotations

from types import ModuleType

from .errors import RunError

__all__ = ["planner_extension"]


def planner_extension() -> ModuleType:
    """The extension module ``hp_recompute._planner``; a clear error where the package was not installed."""
    try:
        from . import _planner as planner
    except ImportError as error:  # a checkout without a build, or a foreign platform
        raise RunError("hp_recompute: the planner extension hp_recompute._planner is missing "
                       f"({error}); install the package (pip install ., or in a checkout bash "
                       "scripts/setup.sh, which installs it into .venv)") from None
    return planner
