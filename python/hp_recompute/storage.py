"""The storage behind a tensor, for byte accounting, on every supported torch.

Why: memory is counted per distinct storage (views share one). torch >= 2.0 offers
``Tensor.untyped_storage()`` and deprecates ``Tensor.storage()`` (a TypedStorage that
warns on every call); torch 1.13 only has the latter. Both results answer
``data_ptr()`` and ``nbytes()``, which is all the callers use.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["storage_of"]


def storage_of(tensor: torch.Tensor) -> Any:
    """The storage of ``tensor``: ``untyped_storage()`` when available, else ``storage()``."""
    untyped = getattr(tensor, "untyped_storage", None)
    return untyped() if untyped is not None else tensor.storage()
