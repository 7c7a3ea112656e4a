"""PlannedSchedule refuses a dx/dw split of a stage holding FSDP2 modules (Rule 1): torch's
stage split, which it runs, is wrong on sharded parameters, so the plan is refused before
any step instead of training on wrong gradients."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torch.distributed.pipelining", reason="needs torch.distributed.pipelining")
from hp_recompute import fsdp  # noqa: E402
from hp_recompute.plan.reader import Action, RunError  # noqa: E402
from hp_recompute.pipelining.schedule import refuse_split_fsdp_stages  # noqa: E402

pytestmark = pytest.mark.skipif(not fsdp.FSDP_AVAILABLE, reason="needs FSDP2 (torch >= 2.6)")


@pytest.fixture
def one_rank_group(tmp_path: Path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_split_fsdp_stage_is_refused_and_a_plain_one_or_an_unsplit_plan_is_not(one_rank_group) -> None:
    from torch.distributed.fsdp import fully_shard

    sharded = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    fully_shard(sharded[0])
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    stages = [types.SimpleNamespace(stage_index=0, submod=sharded), types.SimpleNamespace(stage_index=1, submod=plain)]
    split = [Action("backward_input", 0, 0), Action("backward_weight", 0, 0), Action("backward_input", 1, 0),
             Action("backward_weight", 1, 0)]
    with pytest.raises(RunError, match=r"stage 0 holds FSDP2 modules \(fully_shard\) and the plan splits its "
                                       r"backward into backward_input and backward_weight"):
        refuse_split_fsdp_stages(stages, split)
    refuse_split_fsdp_stages(stages, [Action("backward", 0, 0), *split[2:]])  # B on the FSDP stage: torch's own
    refuse_split_fsdp_stages(stages[1:], split)
