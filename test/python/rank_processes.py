"""Starting a test's rank processes and collecting what each saved.

The tests that run ranks (FSDP, PlannedSchedule, Hugging Face stages) start them as the
runtimes do (``hp_recompute.processes.rank_start_method``: forked from a server that
imported torch once) and read each rank's result file ``cfg["out"]/rank{R}.pt``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.multiprocessing as mp

from hp_recompute.processes import rank_start_method


def spawn_ranks(main: Any, cfg: Dict[str, Any], nprocs: int) -> List[Dict[str, Any]]:
    """Runs ``main(rank, cfg)`` in ``nprocs`` rank processes and returns each rank's result
    (``cfg["out"]/rank{R}.pt``). A rank that raised saved its traceback and left at once
    (``fsdp_worker.finish``): the others are stopped and the tracebacks fail the case. A rank
    killed by SIGABRT after every rank saved its result died in gloo's teardown (results are
    saved before the closing barrier), which says nothing about the case: its results stand.
    Any other death fails the case."""
    files = [Path(cfg["out"]) / f"rank{r}.pt" for r in range(nprocs)]
    try:
        mp.start_processes(main, args=(cfg,), nprocs=nprocs, start_method=rank_start_method(), join=True)
    except mp.ProcessExitedException as e:
        saved = {r: torch.load(f) for r, f in enumerate(files) if f.exists()}
        raised = [f"rank {r}:\n{res['exception']}" for r, res in saved.items() if "exception" in res]
        if raised:
            raise AssertionError("\n".join(raised)) from e
        if e.signal_name != "SIGABRT" or len(saved) < nprocs:
            raise
    return [torch.load(f) for f in files]
