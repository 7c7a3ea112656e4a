"""``FILE.py:FACTORY`` specs, as the exporter's ``--module`` and the runner's
``--model`` take them: one loader, so both tools accept and reject the same
specs with the same messages."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import sysconfig
import traceback
from typing import Any, Callable

__all__ = ["call_factory", "import_file", "raised_at"]

#: Folders whose frames are not the user's code: this package, the standard library and
#: installed packages; torch's folder is added when it is imported (Debian installs it
#: outside them). An error inside a torch op is located at the user's call of it.
_NOT_USER_CODE = {os.path.dirname(os.path.abspath(__file__))} | {
    os.path.abspath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib")}


def raised_at(e: BaseException) -> str:
    """``TYPE: MESSAGE (at FILE:LINE)`` for an exception of the user's code (a factory, a
    model's region), located at the innermost frame of that code; without such a frame
    (an error of the runtime itself, whose message says where) ``TYPE: MESSAGE``. An
    exception raised from another (torch's "[Stage 0] failed to run forward:" around the
    user's, with ``from`` or inside its ``except``) gives each of the chain, outermost first: ``TYPE: MESSAGE: CAUSE: MESSAGE (at
    FILE:LINE)``, located in the innermost one that has a frame of the user's.

    Why: the tools print located one-line errors, never tracebacks; the frame that matters
    to the user is theirs, not the torch op or the runner loop it went through. Any
    exception counts, ``SystemExit`` and ``KeyboardInterrupt`` included: a model that
    exits did not train.
    """
    folders = set(_NOT_USER_CODE)
    if "torch" in sys.modules:
        folders.add(os.path.dirname(os.path.abspath(sys.modules["torch"].__file__ or "")))
    # An error torch raised ``from`` the user's (a stage's "[Stage 0] failed to run forward:"):
    # the user's, at the end of the chain, says what failed and where.
    chain = [e]
    while True:
        last = chain[-1]
        cause = last.__cause__ if last.__cause__ is not None or last.__suppress_context__ else last.__context__
        if cause is None or cause in chain:
            break
        said = _first_line(cause).partition(": ")[2]
        if said and said in str(last):  # a message that already says its cause (ours: "...: TYPE: MESSAGE")
            break
        chain.append(cause)
    frame = None
    for link in reversed(chain):
        theirs = [f for f in traceback.extract_tb(link.__traceback__)
                  if not any(os.path.abspath(f.filename).startswith(folder + os.sep) for folder in folders)]
        if theirs:
            frame = theirs[-1]
            break
    text = ": ".join(_first_line(link) for link in chain)
    return text + (f" (at {frame.filename}:{frame.lineno})" if frame is not None else "")


def _first_line(e: BaseException) -> str:
    """``TYPE: the first line of its message`` (``TYPE`` alone without one)."""
    lines = str(e).strip().splitlines()
    return type(e).__name__ + (f": {lines[0].rstrip(':').rstrip()}" if lines else "")


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
    module = import_file(path, flag, error)
    fn = getattr(module, factory, None)
    if not callable(fn):
        raise error(f"{flag}: '{path}' has no callable '{factory}'")
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 - as in import_file
        raise error(f"{flag}: {factory}() in '{path}' raised {raised_at(e)}") from None


def import_file(path: str, flag: str, error: Callable[[str], Exception]) -> Any:
    """Imports the Python file ``path`` as a module of its own (e.g. a bundled example's model).

    Raises ``error(message)`` naming ``flag`` when the file is missing or its import raises.
    """
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
    except BaseException as e:  # noqa: BLE001 - any exception, SystemExit included (raised_at)
        if sys.modules.get(name) is module:
            del sys.modules[name]
        raise error(f"{flag}: importing '{path}' raised {raised_at(e)}") from None
    finally:
        # Exactly the entry inserted above, even if the module edited sys.path meanwhile
        # (index 0 may then be somebody else's entry).
        if sys.path.count(folder) > before:
            sys.path.remove(folder)  # the first occurrence: ours, inserted at the front
    return module
