"""Shared pytest setup for the Python tests: import ``hp_recompute`` from the source tree, give
the run caches of its own, and register the ``slow`` marker (modules that start processes).

Why per-run caches: inductor keeps compiled kernels on disk (``/tmp/torchinductor_$USER`` by
default), shared by every run and every torch on the machine; a kernel another run left there
(a poisoned or stale cache) failed tests that had nothing wrong. The folder is set in the
environment, so xdist's workers and the processes the tests start (ranks, CLIs) share it (a
graph one worker compiled is not compiled again by the other), and removed at the end.
"""

import os
import shutil
import sys
import tempfile

_PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))
if _PYTHON_DIR not in sys.path:
    sys.path.insert(0, _PYTHON_DIR)

# One folder per run: the first process of the run (pytest, or xdist's controller, which
# starts its workers after this) makes it and removes it; the workers inherit it.
_OWNS_CACHES = "HPR_TEST_CACHES" not in os.environ
if _OWNS_CACHES:
    os.environ["HPR_TEST_CACHES"] = tempfile.mkdtemp(prefix="hpr-test-caches-")
_CACHES = os.environ["HPR_TEST_CACHES"]
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHES, "inductor")
os.environ["TRITON_CACHE_DIR"] = os.path.join(_CACHES, "triton")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test module that starts rank processes or torchrun "
                                       "(seconds a test); CI runs every test, -m 'not slow' is the quick loop")


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001 - pytest's hook signature
    if _OWNS_CACHES:
        shutil.rmtree(_CACHES, ignore_errors=True)
