"""Fixtures of the eager hp_recompute tests: target device and session isolation."""

import pytest
import torch

import hp_recompute as hr
from hpr_eager_util import DEVICE


@pytest.fixture
def device() -> torch.device:
    """The device the tests run on: HPR_TEST_DEVICE (cpu by default, cuda in gpu_check.sh)."""
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("HPR_TEST_DEVICE=cuda but CUDA is not available")
    return torch.device(DEVICE)


@pytest.fixture(autouse=True)
def isolated_sessions():
    """Each test starts with no live session and clears whatever it leaves behind."""
    for sid in hr.live_sessions():
        hr.clear_recompute_session(sid)
    hr.reset_stats()
    yield
    for sid in hr.live_sessions():
        hr.clear_recompute_session(sid)
