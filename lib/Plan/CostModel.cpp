//===- CostModel.cpp - Per-stage time and memory of a planned module -----===//

#include "hpr/Plan/CostModel.h"

using namespace mlir;
using namespace mlir::hpr;

/// Assumed throughput for regions that were not profiled, in FLOP per us.
static constexpr double kFlopsPerUs = 1e6;

/// A measured backward time, or `ratio` times the region's forward.
static double backwardUs(std::optional<llvm::APFloat> measured, double ratio,
                         double forwardUs) {
  if (measured && measured->convertToDouble() > 0)
    return measured->convertToDouble();
  return ratio * forwardUs;
}

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
      cost.backwardInputUs +=
          backwardUs(region.getBwdInputTimeUs(), kInputPerForward, timeUs);
      cost.backwardWeightUs +=
          backwardUs(region.getBwdWeightTimeUs(), kWeightPerForward, timeUs);
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
      cost.forwardUs = cost.backwardInputUs = cost.backwardWeightUs = 1;
    }
  return costs;
}
