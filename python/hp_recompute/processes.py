"""How a runtime starts its rank processes: forked from one server that imported torch once.

A rank started with ``spawn`` is a fresh interpreter that imports torch and hp_recompute
before its first action: about two seconds of CPU per rank, paid again by every run. With
``rank_start_method()`` the ranks are forked from multiprocessing's fork server, which
imports ``PRELOADED`` once when it starts; each rank then begins with them imported, in a
process of its own. As under ``spawn``, no state of the starting process is inherited and
each rank gets the starter's ``sys.path``, working directory and main module at its start;
unlike ``spawn``, its environment is the server's: the starter's when the server started
(a runtime's first start; the CLIs start it in a process of their own).

The preload list is the fork server's, one per process: only the first start reads it. It
holds the modules of ``PRELOADED`` the starting process has imported: the server imports
only what is known to import here (the server itself survives only an ``ImportError``; torch
1.13's ``torch.distributed.fsdp`` raises a ``ValueError`` on Python 3.11).
"""

from __future__ import annotations

import multiprocessing
import sys

__all__ = ["PRELOADED", "rank_start_method"]

#: Imported once by the fork server, those of them the starting process imported.
PRELOADED = ("torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.pipelining",
             "hp_recompute", "hp_recompute.runner")


def rank_start_method() -> str:
    """The start method for rank processes (``"forkserver"``), its preload list set."""
    multiprocessing.get_context("forkserver").set_forkserver_preload([m for m in PRELOADED if m in sys.modules])
    return "forkserver"
