"""pytest plugin: run PyTorch's own checkpoint tests against ``hp_recompute.checkpoint``.

torch's checkpoint is the spec of ours outside sessions (NOTE [ Recompute sessions ],
Rule 3), so its test suite is our conformance suite. Its files are not in this repository;
``scripts/conformance.sh`` runs them from a PyTorch source tree, twice: as they are
(the baseline, against the installed torch) and with ``HPR_CONFORMANCE_PATCH=1``, where

1. ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` is
   ``hp_recompute.checkpoint``; a call with ``use_reentrant=True`` or without it stays
   torch's (the reentrant variant is not ours);
2. ``checkpoint_wrapper(module, CheckpointImpl.NO_REENTRANT)`` without a
   ``checkpoint_fn`` (also ``apply_activation_checkpointing``'s default) is
   ``hp_recompute.checkpoint_wrapper``, and torch's ``CheckpointWrapper`` built directly
   checkpoints through rule 1;
3. ``hp_recompute`` itself keeps torch's own function where it hands a call to torch
   (use_reentrant=True, a torch.compile trace), so nothing loops back into rule 1.

Only the tests that are about checkpointing run: those whose class or source mentions
``checkpoint``. The patch is applied when pytest loads this plugin, before the test
modules bind ``from torch.utils.checkpoint import checkpoint``. At the end the plugin
prints how many calls each side served: a patched run that served none from
``hp_recompute`` tested nothing.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import types
from typing import Any, Dict, List

import pytest
import torch.utils.checkpoint as torch_checkpoint

PATCHED = os.environ.get("HPR_CONFORMANCE_PATCH") == "1"
SERVED: Dict[str, int] = {"hp_recompute": 0, "torch": 0}


def _patch() -> None:
    import torch.distributed.algorithms._checkpoint.checkpoint_wrapper as torch_wrapper

    import hp_recompute
    import hp_recompute.checkpoint as ours

    original, original_wrapper = torch_checkpoint.checkpoint, torch_wrapper.checkpoint_wrapper

    class _TorchAsItWas(types.ModuleType):  # rule 3
        checkpoint = staticmethod(original)

        def __getattr__(self, name: str) -> Any:
            return getattr(torch_checkpoint, name)

    ours._torch_checkpoint = _TorchAsItWas("torch.utils.checkpoint")

    @functools.wraps(original)
    def checkpoint(function: Any, *args: Any, use_reentrant: Any = None, **kwargs: Any) -> Any:  # rule 1
        if use_reentrant is False:
            SERVED["hp_recompute"] += 1
            return hp_recompute.checkpoint(function, *args, use_reentrant=False, **kwargs)
        SERVED["torch"] += 1
        return original(function, *args, use_reentrant=use_reentrant, **kwargs)

    @functools.wraps(original_wrapper)
    def checkpoint_wrapper(module: Any, checkpoint_impl: Any = torch_wrapper.CheckpointImpl.NO_REENTRANT,
                           checkpoint_fn: Any = None, **kwargs: Any) -> Any:  # rule 2
        if checkpoint_impl == torch_wrapper.CheckpointImpl.NO_REENTRANT and checkpoint_fn is None:
            return hp_recompute.checkpoint_wrapper(module, **kwargs)
        return original_wrapper(module, checkpoint_impl, checkpoint_fn, **kwargs)

    torch_checkpoint.checkpoint = checkpoint
    torch_wrapper.torch_utils_checkpoint = checkpoint
    torch_wrapper.checkpoint_wrapper = checkpoint_wrapper
    apply = torch_wrapper.apply_activation_checkpointing
    apply.__defaults__ = tuple(checkpoint_wrapper if d is original_wrapper else d for d in apply.__defaults__)


if PATCHED:
    _patch()


def _about_checkpointing(item: pytest.Item) -> bool:
    cls = getattr(item, "cls", None)
    if cls is not None and "checkpoint" in cls.__name__.lower():
        return True
    function = getattr(item, "function", None)
    try:
        return function is not None and "checkpoint" in inspect.getsource(function).lower()
    except (OSError, TypeError):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    keep = [item for item in items if _about_checkpointing(item)]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def pytest_terminal_summary(terminalreporter: Any) -> None:
    mode = "patched (hp_recompute)" if PATCHED else "baseline (torch)"
    terminalreporter.write_line(f"hpr-conformance: {mode}; non-reentrant checkpoint calls served: {SERVED}")
    served = os.environ.get("HPR_CONFORMANCE_SERVED")
    if served:  # scripts/conformance.sh: a patched run that served nothing tested nothing
        with open(served, "w", encoding="utf-8") as f:
            json.dump(SERVED, f)
