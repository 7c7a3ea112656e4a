"""Running a plan under torchrun: ``torchrun --nproc-per-node N -m hp_recompute.run --plan P``.

Why: that is how torch users launch, on one node or several (``--nnodes``,
``--rdzv-endpoint``). torchrun starts one process per rank and sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; each process joins the gloo group
with ``env://``, runs its rank's program (``multiprocess.run_rank_steps``, the same code as
the self-spawning mode) and sends its results to rank 0 (``gather_object``), which
compares them with the reference step and reports.

Initial weights: rank 0's, broadcast to every rank, so a factory that draws random
weights without a seed still gives one model. A failing rank prints its error and exits
1; torchrun then stops the other workers (its default), and a rank blocked in a receive
from the failed one gives up after ``--timeout`` at the latest.

Joining the group (``_join_group``) is bounded too: a port already in use, a peer that never
joins or a master that never answers ends the process with one located line and exit 1
after ``--timeout`` (plus ``FORM_SLACK_S`` at most), not with torch's traceback or a hang.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import os
import select
import tempfile
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from .multiprocess import compare_steps, run_rank_steps
from .model import load_model, split_stages
from ..errors import RunError
from ..plan.reader import Plan
from ..sessions import SessionScope

__all__ = ["torchrun_rank", "run_torchrun"]

#: Seconds past ``--timeout`` after which a group that has not formed is given up on even
#: when torch itself still waits (a program on MASTER_PORT that accepts and never answers:
#: torch 1.13 and 2.x then wait forever).
FORM_SLACK_S = 5.0


def torchrun_rank() -> Optional[Tuple[int, int]]:
    """(rank, world size) when torchrun (or another env:// launcher) started this process."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise RunError(f"hp_recompute.run: RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
                       f"must be integers (set by torchrun)") from None


def _join_group(rank: int, world: int, timeout: float) -> None:
    """``init_process_group("gloo", "env://")``, or RunError within ``timeout`` + FORM_SLACK_S.

    torch logs its own connection attempts on stderr (with C++ stack frames); they are held
    back while the group forms and shown only when it formed, so a failure prints one line.
    torch 1.13 keeps the GIL while its store client waits for an answer, so no Python thread
    could end that wait: a forked watchdog prints the error when the slack is up, and
    ``faulthandler`` (a C thread) exits the process with status 1 just after.
    """
    failed = (f"hp_recompute.run: rank {rank}: the process group of {world} ranks did not form "
              f"(MASTER_ADDR {os.environ['MASTER_ADDR']}, MASTER_PORT {os.environ['MASTER_PORT']}, "
              f"--timeout {timeout:g} s)")
    limit = timeout + FORM_SLACK_S
    stderr = os.dup(2)
    done_r, done_w = os.pipe()
    watchdog = os.fork()
    if watchdog == 0:  # the watchdog: system calls only, then _exit
        os.close(done_w)
        if not select.select([done_r], [], [], limit)[0]:  # the pipe closes when the group formed
            os.write(stderr, f"{failed}: no answer within {limit:g} s (is another program listening on "
                             f"MASTER_PORT?)\n".encode())
        os._exit(0)
    os.close(done_r)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        faulthandler.dump_traceback_later(limit + 0.5, exit=True, file=held)
        try:
            dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001 - torch's error types differ between versions
            lines = str(e).strip().splitlines()
            raise RunError(f"{failed}: {lines[0] if lines else type(e).__name__}") from None
        else:
            held.seek(0)
            os.write(stderr, held.read())
        finally:
            faulthandler.cancel_dump_traceback_later()
            os.close(done_w)
            os.waitpid(watchdog, 0)
            os.dup2(stderr, 2)
            os.close(stderr)


def run_torchrun(plan: Plan, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """Runs this process's rank; returns the comparison on rank 0 and None elsewhere."""
    rank, world = torchrun_rank() or (0, 1)
    if world != plan.num_ranks:
        raise RunError(f"hp_recompute.run: torchrun started {world} processes (WORLD_SIZE), but the plan has "
                       f"{plan.num_ranks} ranks ({plan.path}: /schedule/num_ranks)")
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise RunError(f"hp_recompute.run: RANK and WORLD_SIZE are set but {key} is not; launch with torchrun")
    torch.set_num_threads(args.threads)
    _join_group(rank, world, args.timeout)
    try:
        model = load_model(args.model, input_shape=args.input_shape)
        with torch.no_grad():
            for tensor in model.module.state_dict().values():
                dist.broadcast(tensor, src=0)
        initial = {k: v.clone() for k, v in model.module.state_dict().items()} if rank == 0 else None
        cfg = {"seed": args.seed, "steps": args.steps, "timeout": args.timeout, "mode": args.checkpoint_mode}
        steps = run_rank_steps(rank, plan, model, cfg, SessionScope(f"hp_recompute.run rank {rank}"))
        gathered = [None] * world if rank == 0 else None
        dist.gather_object({"rank": rank, "steps": steps}, gathered, dst=0)
        if rank != 0:
            return None
        results = {g["rank"]: g for g in gathered}  # type: ignore[union-attr]
        # a fresh model: adapters' units close over their module
        reference = load_model(args.model, input_shape=args.input_shape)
        reference.module.load_state_dict(initial)
        specs = split_stages(plan, reference)
        compared = compare_steps(plan, reference, specs, results, args)
        compared["mode"] = f"torchrun ({world} processes)"
        return compared
    finally:
        dist.destroy_process_group()
