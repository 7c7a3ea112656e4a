"""hp_recompute: schedulable activation recompute for pipeline-parallel training (eager PyTorch).

One recompute session per (stage, microbatch) is replayed once -- before the backward
or earlier (prefetch) -- shared by the dx and dw backwards, and cleared after its last
consumer. See NOTE [ Recompute sessions ] in ``hp_recompute/checkpoint.py`` and
``docs/python-api.md``. ``make_plan`` and ``verify_plan`` run the C++ planner in process.
``hp_recompute.fsdp`` reduces FSDP2 gradients once per step after a split backward.
``compile_backend`` compiles a block whose backward I and W split (torch >= 2.13).
"""

from . import fsdp
from .backward_split import backward_input, backward_weight
from .checkpoint import checkpoint, recompute_handle_collector_ctx
from .compile_split import compile_backend
from .errors import CheckpointError, HPRecomputeError
from .frame import RecomputeHandle
from .planner import PlanError, PlanWarning, make_plan, verify_plan
from .sessions import (
    DEFAULT_SCOPE,
    SessionScope,
    clear_recompute_session,
    live_sessions,
    recompute_handle,
    recompute_session_ctx,
    reset_stats,
    session_stats,
    stats,
)
from .selective import selective_context_fn
from .wrapper import checkpoint_wrapper, convert_checkpoint_wrappers

__all__ = [
    "DEFAULT_SCOPE",
    "CheckpointError",
    "HPRecomputeError",
    "PlanError",
    "PlanWarning",
    "RecomputeHandle",
    "backward_input",
    "backward_weight",
    "checkpoint",
    "checkpoint_wrapper",
    "clear_recompute_session",
    "compile_backend",
    "convert_checkpoint_wrappers",
    "fsdp",
    "live_sessions",
    "make_plan",
    "recompute_handle",
    "recompute_handle_collector_ctx",
    "recompute_session_ctx",
    "reset_stats",
    "selective_context_fn",
    "SessionScope",
    "session_stats",
    "stats",
    "verify_plan",
]
