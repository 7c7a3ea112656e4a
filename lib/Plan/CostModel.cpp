//===- CostModel.cpp - Per-stage time and memory of a planned module -----===//

#include "hpr/Plan/CostModel.h"

using namespace mlir;
using namespace mlir::hpr;

/// Assumed throughput for regions that were not profiled, in FLOP per us.
static constexpr double kFlopsPerUs = 1e6;

std::vector<StageCost> mlir::hpr::computeStageCosts(ModelOp model) {
  std::vector<StageCost> costs;
  bool anyCost = false;
  for (StageOp stage : model.getBody().getOps<StageOp>()) {
    StageCost cost;
    for (RegionOp region : stage.getBody().getOps<RegionOp>()) {
      double timeUs = region.getFwdTimeUs().convertToDouble();
      if (timeUs <= 0)
        timeUs = region.getFwdFlops().convertToDouble() / kFlopsPerUs;
      cost.forwardUs += timeUs;
      if (region.getCheckpoint()) {
        cost.checkpointed = true;
        cost.recomputeUs += timeUs;
        cost.keptBytes += region.getInputBytes();
        cost.recomputedBytes += region.getSavedBytes();
      } else {
        cost.keptBytes += region.getSavedBytes();
      }
    }
    anyCost |= cost.forwardUs > 0;
    costs.push_back(cost);
  }
  if (!anyCost)
    for (StageCost &cost : costs) {
      cost.recomputeUs = cost.checkpointed ? 1 : 0;
      cost.forwardUs = 1;
    }
  return costs;
}
