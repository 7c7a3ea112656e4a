"""``python3 -m hp_recompute.run``: the plan runner's command line (``runner/cli.py``)."""

import sys

from .runner.cli import REPORT_FORMAT, main, run

__all__ = ["REPORT_FORMAT", "main", "run"]

if __name__ == "__main__":
    sys.exit(main())
