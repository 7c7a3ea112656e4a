"""Console entry points ``hp-recompute-plan`` and ``hp-recompute-opt`` of an installed package.

The tools are the C++ executables a pip install puts in ``hp_recompute/bin``; these
entry points replace the Python process with them (``os.execv``), so arguments, standard
streams, exit codes and signals are the tool's own (docs/cli.md).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn, Optional

__all__ = ["plan_main", "opt_main", "tool_path"]


def tool_path(name: str) -> Optional[str]:
    """The installed executable ``name`` (``hp-recompute-plan``, ``hp-recompute-opt``), or None.

    It lies in ``bin/`` of the package; an editable install's package spans the checkout's
    sources and the build's installed files, so every folder of ``__path__`` is looked in.
    """
    import hp_recompute

    for folder in hp_recompute.__path__:
        path = os.path.join(folder, "bin", name)
        if os.access(path, os.X_OK):
            return path
    return None


def _exec(name: str) -> NoReturn:
    path = tool_path(name)
    if path is None:
        sys.stderr.write(f"{name}: error: the executable is not installed with this hp_recompute; install the "
                         f"package with pip (pip install .), or in a checkout run build/bin/{name} after "
                         f"bash scripts/build.sh\n")
        raise SystemExit(2)
    os.execv(path, [name, *sys.argv[1:]])


def plan_main() -> NoReturn:
    """``hp-recompute-plan``: the planner CLI."""
    _exec("hp-recompute-plan")


def opt_main() -> NoReturn:
    """``hp-recompute-opt``: the passes on hpr IR, as mlir-opt."""
    _exec("hp-recompute-opt")
