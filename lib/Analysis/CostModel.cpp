//===- CostModel.cpp - Per-stage time and memory of a module -------------===//

#include "hpr/Analysis/CostModel.h"

#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::hpr;

/// Assumed throughput for regions that were not profiled, in FLOP per us.
static constexpr double kFlopsPerUs = 1e6;

/// A measured time, or `fallback` when the region was not profiled for it.
static double measuredOr(std::optional<llvm::APFloat> measured,
                         double fallback) {
  if (measured && measured->convertToDouble() > 0)
    return measured->convertToDouble();
  return fallback;
}

std::vector<StageCost> mlir::hpr::computeStageCosts(
    ModelOp model, llvm::function_ref<bool(RegionOp)> isCheckpointed) {
  std::vector<StageCost> costs;
  bool anyCost = false;
  for (StageOp stage : model.getBody().getOps<StageOp>()) {
    StageCost cost;
    for (RegionOp region : stage.getBody().getOps<RegionOp>()) {
      double timeUs = region.getFwdTimeUs().convertToDouble();
      if (timeUs <= 0)
        timeUs = region.getFwdFlops().convertToDouble() / kFlopsPerUs;
      double inputUs =
          measuredOr(region.getBwdInputTimeUs(), kInputPerForward * timeUs);
      double weightUs =
          measuredOr(region.getBwdWeightTimeUs(), kWeightPerForward * timeUs);
      cost.backwardInputUs += inputUs;
      cost.backwardWeightUs += weightUs;
      cost.backwardUs += measuredOr(region.getBwdTimeUs(), inputUs + weightUs);
      cost.gradBytes += region.getParamBytes();
      cost.weightStateBytes += region.getBwdWeightInputBytes().value_or(0);
      cost.workspaceBytes = std::max<int64_t>(
          cost.workspaceBytes, region.getBwdWorkspaceBytes().value_or(0));
      cost.plainForwardUs += timeUs;
      cost.plainKeptBytes += region.getSavedBytes();
      if (isCheckpointed ? isCheckpointed(region) : region.getCheckpoint()) {
        cost.checkpointed = true;
        cost.forwardUs += measuredOr(region.getCheckpointFwdTimeUs(), timeUs);
        cost.recomputeUs += measuredOr(region.getReplayTimeUs(), timeUs);
        cost.keptBytes += region.getInputBytes();
        cost.recomputedBytes += region.getSavedBytes();
      } else {
        cost.forwardUs += timeUs;
        cost.keptBytes += region.getSavedBytes();
      }
    }
    anyCost |= cost.plainForwardUs > 0;
    // The model input needs no gradient: the first stage's I computes
    // nothing and keeps nothing, and its W is one full backward.
    if (costs.empty()) {
      cost.backwardWeightUs = cost.backwardUs;
      cost.backwardInputUs = 0;
      cost.weightStateBytes = 0;
    }
    costs.push_back(cost);
  }
  // A stage's output is the next stage's input.
  for (auto [index, stage] : llvm::enumerate(model.getBody().getOps<StageOp>()))
    if (index > 0)
      for (RegionOp region : stage.getBody().getOps<RegionOp>()) {
        costs[index - 1].outputBytes = region.getInputBytes();
        break;
      }
  if (!anyCost)
    for (StageCost &cost : costs) {
      cost.recomputeUs = cost.checkpointed ? 1 : 0;
      cost.forwardUs = cost.plainForwardUs = 1;
      cost.backwardInputUs = cost.backwardWeightUs = 1;
      cost.backwardUs = 2;
    }
  return costs;
}

bool mlir::hpr::runsCheckpointed(ForwardOp forward,
                                 const std::vector<StageCost> &costs) {
  return costs[forward.getStageIndex()].checkpointed &&
         !forward.getNoCheckpoint();
}
