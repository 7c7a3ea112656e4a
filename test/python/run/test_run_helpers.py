"""Small helpers of the runner and the exporter that the end-to-end runs do not isolate."""

from __future__ import annotations

import warnings

import torch

from hp_recompute.storage import storage_of


def test_storage_of_counts_the_whole_storage_of_a_view() -> None:
    base = torch.zeros(3, 4)
    view = base[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch 2.x warns on every Tensor.storage() call
        assert storage_of(view).data_ptr() == storage_of(base).data_ptr()
        assert storage_of(view).nbytes() == base.numel() * base.element_size()


class _WithUntypedStorage(torch.Tensor):
    """Stands in for torch >= 2.0 on torch 1.13: a tensor that has ``untyped_storage()``."""

    def untyped_storage(self):  # noqa: D102 - a marker, not a storage
        return "untyped"


def test_storage_of_prefers_untyped_storage() -> None:
    assert storage_of(torch.zeros(2).as_subclass(_WithUntypedStorage)) == "untyped"
