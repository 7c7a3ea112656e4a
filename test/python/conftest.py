"""Shared pytest setup for the Python tests: import ``hp_recompute`` from the source tree."""

import os
import sys

_PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))
if _PYTHON_DIR not in sys.path:
    sys.path.insert(0, _PYTHON_DIR)
