"""The model JSON graph (docs/models.md) of a module's measured regions: the planner's input
without times, as the exporter writes it (``--model-json``) and ``python -m hp_recompute.costs
--module`` completes it with measured times."""

from __future__ import annotations

from typing import Sequence

from .measure import Segment

__all__ = ["MODEL_FORMAT", "model_graph", "segment_json"]

MODEL_FORMAT = "hp-recompute-model"


def segment_json(seg: Segment) -> dict:
    """One region of the exporter's sidecar: what was measured of ``seg``."""
    return {
        "name": seg.name,
        "checkpointable": seg.checkpointable,
        "saved_bytes": sum(seg.saved.values()),
        "input_bytes": sum(seg.inputs.values()),
        "param_bytes": sum(seg.params.values()),
        **_tied_params(seg),
        "bwd_weight_input_bytes": sum(seg.weight_grads.values()),
        **({"replay_weight_bytes": sum(seg.weight_saved.values())} if seg.checkpointable else {}),
        "fwd_flops": seg.flops,
        "input_shapes": seg.input_shapes,
        "output_shapes": seg.output_shapes,
        **({"output_bytes": seg.output_bytes} if seg.output_bytes else {}),
    }


def _tied_params(seg: Segment) -> dict:
    """The ``tied_params`` member of ``seg``'s region (docs/models.md): none when it shares no
    parameter with another region."""
    if not seg.tied:
        return {}
    return {"tied_params": [{"name": name, "bytes": nbytes} for name, nbytes in seg.tied.items()]}


def model_graph(name: str, segments: Sequence[Segment]) -> dict:
    """The model JSON graph (docs/models.md) of measured ``segments``: the planner's input,
    without times (``python -m hp_recompute.costs --module`` adds them). A region's
    ``bwd_weight_input_bytes`` (what its dx keeps for its dw, ``measure.py``) and a
    checkpointable one's ``replay_weight_bytes`` (what its dw reads of a replay) are written
    where they are not 0: a region without trainable parameters keeps nothing, which 0 says
    too, and a replay of which the dw reads nothing is priced whole after the dx (0 =
    unknown), which only overstates it; the last region's ``output_bytes`` (the model output)
    likewise."""
    regions = [segment_json(s) for s in segments]
    return {"format": MODEL_FORMAT, "version": 1, "name": name, "regions": [
        {"name": r["name"], "checkpoint": False, "checkpointable": r["checkpointable"],
         "fwd_flops": int(r["fwd_flops"]), "fwd_time_us": 0,
         **({"bwd_weight_input_bytes": r["bwd_weight_input_bytes"]} if r["bwd_weight_input_bytes"] else {}),
         **({"replay_weight_bytes": r["replay_weight_bytes"]} if r.get("replay_weight_bytes") else {}),
         "saved_bytes": r["saved_bytes"], "input_bytes": r["input_bytes"],
         "param_bytes": r["param_bytes"], **_tied_params(s),
         **({"output_bytes": r["output_bytes"]} if r.get("output_bytes") else {})} for r, s in zip(regions, segments)]}
