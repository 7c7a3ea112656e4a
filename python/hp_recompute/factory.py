"""``FILE.py:FACTORY`` specs, as the exporter's ``--module`` and the runner's
``--model`` take them: one loader, so both tools accept and reject the same
specs with the same messages."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from typing import Any, Callable


def call_factory(spec: str, flag: str, error: Callable[[str], Exception]) -> Any:
    """Imports ``FILE.py`` and returns ``FACTORY()``.

    Args:
        spec: ``FILE.py:FACTORY``.
        flag: how the caller names the spec in messages, e.g. ``"hp_recompute: --module"``.
        error: builds the exception raised for a bad spec (the caller's own error type).
    Returns:
        Whatever the factory returns; the caller checks its type.
    """
    path, sep, factory = spec.rpartition(":")
    if not sep or not path or not factory:
        raise error(f"{flag}: expected FILE.py:FACTORY, got '{spec}'")
    if not os.path.isfile(path):
        raise error(f"{flag}: no such file '{path}'")
    # A private module name per file (its stem and a digest of its absolute path), so
    # two specs never share a module, not even two ``model.py`` in different folders.
    folder = os.path.dirname(os.path.abspath(path))
    stem = os.path.splitext(os.path.basename(path))[0]
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    name = f"_hpr_factory_{re.sub(r'[^0-9A-Za-z_]', '_', stem)}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    # Registered before it runs, as the import system does: @dataclass and typing look
    # the defining module up in sys.modules (``from __future__ import annotations``).
    sys.modules[name] = module
    # The factory's file may import its neighbours.
    before = sys.path.count(folder)
    sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        if sys.modules.get(name) is module:
            del sys.modules[name]
        raise
    finally:
        # Exactly the entry inserted above, even if the module edited sys.path meanwhile
        # (index 0 may then be somebody else's entry).
        if sys.path.count(folder) > before:
            sys.path.remove(folder)  # the first occurrence: ours, inserted at the front
    fn = getattr(module, factory, None)
    if not callable(fn):
        raise error(f"{flag}: '{path}' has no callable '{factory}'")
    return fn()
