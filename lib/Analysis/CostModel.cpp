//===- CostModel.cpp - Per-stage time and memory of a module -------------===//

#include "hpr/Analysis/CostModel.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/ErrorHandling.h"

#include <algorithm>

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

double mlir::hpr::allGatherUs(int64_t bytes, int64_t ranks) {
  if (ranks <= 1 || bytes <= 0)
    return 0;
  return double(ranks - 1) / double(ranks) * double(bytes) /
             kCollectiveBytesPerUs +
         kCollectiveLatencyUs;
}

double mlir::hpr::allReduceUs(int64_t bytes, int64_t ranks) {
  if (ranks <= 1 || bytes <= 0)
    return 0;
  return 2 * double(ranks - 1) / double(ranks) * double(bytes) /
             kCollectiveBytesPerUs +
         kCollectiveLatencyUs;
}

llvm::StringRef mlir::hpr::regionTimeKey(RegionTime time) {
  switch (time) {
  case RegionTime::Forward:
    return "fwd_time_us";
  case RegionTime::CheckpointForward:
    return "checkpoint_fwd_time_us";
  case RegionTime::Replay:
    return "replay_time_us";
  case RegionTime::SelectiveForward:
    return "selective_fwd_time_us";
  case RegionTime::SelectiveReplay:
    return "selective_replay_time_us";
  case RegionTime::BackwardInput:
    return "bwd_input_time_us";
  case RegionTime::BackwardWeight:
    return "bwd_weight_time_us";
  case RegionTime::Backward:
    return "bwd_time_us";
  }
  llvm_unreachable("unknown region time");
}

RegionCheckpoint mlir::hpr::regionCheckpointOf(RegionOp region) {
  if (!region.getCheckpoint())
    return RegionCheckpoint::None;
  return region.getSelective() ? RegionCheckpoint::Selective
                               : RegionCheckpoint::Full;
}

llvm::StringRef mlir::hpr::regionCheckpointName(RegionCheckpoint checkpoint) {
  switch (checkpoint) {
  case RegionCheckpoint::None:
    return "none";
  case RegionCheckpoint::Full:
    return "full";
  case RegionCheckpoint::Selective:
    return "selective";
  }
  llvm_unreachable("unknown region checkpoint");
}

std::optional<RegionCheckpoint>
mlir::hpr::parseRegionCheckpoint(llvm::StringRef name) {
  for (RegionCheckpoint checkpoint :
       {RegionCheckpoint::None, RegionCheckpoint::Full,
        RegionCheckpoint::Selective})
    if (name == regionCheckpointName(checkpoint))
      return checkpoint;
  return std::nullopt;
}

std::optional<RegionTime> mlir::hpr::regionTimeOf(sched::ActionKind kind,
                                                  bool firstStage,
                                                  bool checkpointedForward,
                                                  RegionCheckpoint checkpoint) {
  using Kind = sched::ActionKind;
  bool selective = checkpoint == RegionCheckpoint::Selective;
  switch (kind) {
  case Kind::Forward:
    if (checkpoint == RegionCheckpoint::None || !checkpointedForward)
      return RegionTime::Forward;
    return selective ? RegionTime::SelectiveForward
                     : RegionTime::CheckpointForward;
  case Kind::Recompute:
    if (checkpoint == RegionCheckpoint::None)
      return std::nullopt;
    return selective ? RegionTime::SelectiveReplay : RegionTime::Replay;
  // The model input needs no gradient: the first stage's I computes nothing,
  // and its W is one full backward from the output.
  case Kind::BackwardInput:
    if (firstStage)
      return std::nullopt;
    return RegionTime::BackwardInput;
  case Kind::BackwardWeight:
    return firstStage ? RegionTime::Backward : RegionTime::BackwardWeight;
  case Kind::Backward:
    return RegionTime::Backward;
  default:
    return std::nullopt;
  }
}

double mlir::hpr::regionTimeUs(RegionOp region, RegionTime time) {
  double forwardUs = region.getFwdTimeUs().convertToDouble();
  if (forwardUs <= 0)
    forwardUs = region.getFwdFlops().convertToDouble() / kFlopsPerUs;
  auto inputUs = [&] {
    return measuredOr(region.getBwdInputTimeUs(), kInputPerForward * forwardUs);
  };
  auto weightUs = [&] {
    return measuredOr(region.getBwdWeightTimeUs(),
                      kWeightPerForward * forwardUs);
  };
  switch (time) {
  case RegionTime::Forward:
    return forwardUs;
  case RegionTime::CheckpointForward:
    return measuredOr(region.getCheckpointFwdTimeUs(), forwardUs);
  case RegionTime::Replay:
    return measuredOr(region.getReplayTimeUs(), forwardUs);
  // Only measured regions are selective (RegionOp::verify); the fallbacks
  // are the full checkpoint's.
  case RegionTime::SelectiveForward:
    return measuredOr(region.getSelectiveFwdTimeUs(),
                      measuredOr(region.getCheckpointFwdTimeUs(), forwardUs));
  case RegionTime::SelectiveReplay:
    return measuredOr(region.getSelectiveReplayTimeUs(),
                      measuredOr(region.getReplayTimeUs(), forwardUs));
  case RegionTime::BackwardInput:
    return inputUs();
  case RegionTime::BackwardWeight:
    return weightUs();
  case RegionTime::Backward:
    return measuredOr(region.getBwdTimeUs(), inputUs() + weightUs());
  }
  llvm_unreachable("unknown region time");
}

bool mlir::hpr::isCheckpointCandidate(RegionOp region) {
  return !region.getNonCheckpointable() &&
         region.getSavedBytes() > region.getInputBytes();
}

std::vector<StageCost> mlir::hpr::computeStageCosts(
    ModelOp model,
    llvm::function_ref<RegionCheckpoint(RegionOp)> checkpointOf) {
  using Kind = sched::ActionKind;
  std::vector<StageCost> costs;
  bool anyCost = false;
  int64_t shard = model.getDpShard().value_or(1);
  int64_t replicate = model.getDpReplicate().value_or(1);
  for (StageOp stage : model.getBody().getOps<StageOp>()) {
    StageCost cost;
    bool firstStage = costs.empty();
    auto regions = stage.getBody().getOps<RegionOp>();
    RegionOp firstRegion = regions.empty() ? RegionOp() : *regions.begin();
    for (RegionOp region : regions) {
      RegionCheckpoint checkpoint =
          checkpointOf ? checkpointOf(region) : regionCheckpointOf(region);
      // Each action's time is the sum of its regions' times (regionTimeOf).
      auto add = [&](double &sum, Kind kind, bool checkpointedForward) {
        if (std::optional<RegionTime> time =
                regionTimeOf(kind, firstStage, checkpointedForward, checkpoint))
          sum += regionTimeUs(region, *time);
      };
      add(cost.forwardUs, Kind::Forward, /*checkpointedForward=*/true);
      add(cost.plainForwardUs, Kind::Forward, /*checkpointedForward=*/false);
      add(cost.recomputeUs, Kind::Recompute, true);
      add(cost.backwardInputUs, Kind::BackwardInput, true);
      add(cost.backwardWeightUs, Kind::BackwardWeight, true);
      add(cost.backwardUs, Kind::Backward, true);
      cost.paramBytes += region.getParamBytes();
      cost.weightStateBytes += region.getBwdWeightInputBytes().value_or(0);
      // A split backward action's transient bytes: its largest region's, per
      // kind (an I or W measured alone, else as a full backward's); a whole
      // backward walks the regions (wholeBackwardPeakBytes).
      int64_t whole = region.getBwdWorkspaceBytes().value_or(0);
      cost.inputWorkspaceBytes =
          std::max<int64_t>(cost.inputWorkspaceBytes,
                            region.getBwdInputWorkspaceBytes().value_or(whole));
      cost.weightWorkspaceBytes = std::max<int64_t>(
          cost.weightWorkspaceBytes,
          region.getBwdWeightWorkspaceBytes().value_or(whole));
      cost.plainKeptBytes += region.getSavedBytes();
      cost.replaysOnce |= region.getSelective() && region.getCheckpoint();
      if (checkpoint != RegionCheckpoint::None) {
        if (region == firstRegion)
          cost.keptInputBytes = region.getInputBytes();
        cost.checkpointed = true;
        cost.keptBytes += region.getInputBytes() +
                          region.getCheckpointStateBytes().value_or(0);
        int64_t replayBytes =
            region.getReplayBytes().value_or(region.getSavedBytes());
        // What dx leaves for dw (hpr.split.release-unread): a selective
        // checkpoint keeps all of it (that rule releases nothing there).
        int64_t weightBytes = std::min<int64_t>(
            replayBytes, region.getReplayWeightBytes().value_or(replayBytes));
        if (checkpoint == RegionCheckpoint::Selective) {
          cost.keptBytes += region.getSelectiveSavedBytes().value_or(0);
          replayBytes = region.getSelectiveReplayBytes().value_or(replayBytes);
          weightBytes = replayBytes;
        }
        cost.recomputedBytes += replayBytes;
        cost.weightRecomputedBytes += weightBytes;
        ReplayedRegionCost replayed;
        if (std::optional<RegionTime> time =
                regionTimeOf(Kind::Recompute, firstStage, true, checkpoint))
          replayed.replayUs = regionTimeUs(region, *time);
        replayed.replayBytes = replayBytes;
        replayed.weightReplayBytes = weightBytes;
        replayed.keptThrough = cost.keptBytes;
        cost.replayedRegions.push_back(replayed);
      } else {
        cost.keptBytes += region.getSavedBytes();
      }
      BackwardRegionCost walked;
      walked.keptThrough = cost.keptBytes;
      walked.plainKeptThrough = cost.plainKeptBytes;
      if (checkpoint != RegionCheckpoint::None)
        walked.replayed = int64_t(cost.replayedRegions.size()) - 1;
      walked.workspaceBytes = whole;
      if (!cost.backwardRegions.empty())
        cost.backwardRegions.back().outputGradBytes = region.getInputBytes();
      cost.backwardRegions.push_back(walked);
    }
    cost.backwardReplayBytes = backwardReplayBytesAfter(cost, {});
    anyCost |= cost.plainForwardUs > 0;
    // The first stage's I keeps nothing for its W (regionTimeOf: its W is
    // one full backward).
    if (firstStage)
      cost.weightStateBytes = 0;
    cost.dpShard = shard;
    cost.unshardUs = allGatherUs(cost.paramBytes, shard);
    // A reduce-scatter moves what the all-gather does.
    cost.reduceGradUs =
        cost.unshardUs + allReduceUs(cost.shardedParamBytes(), replicate);
    costs.push_back(cost);
  }
  // A stage's output is the next stage's input; the last stage's is the
  // model output (its last region's output_bytes), whose gradient the loss
  // outside the model makes inside the stage's backward.
  RegionOp lastRegion;
  for (auto [index, stage] : llvm::enumerate(model.getBody().getOps<StageOp>()))
    for (auto [position, region] :
         llvm::enumerate(stage.getBody().getOps<RegionOp>())) {
      if (index > 0 && position == 0)
        costs[index - 1].outputBytes = region.getInputBytes();
      lastRegion = region;
    }
  if (lastRegion && !costs.back().backwardRegions.empty()) {
    costs.back().outputBytes = lastRegion.getOutputBytes().value_or(0);
    costs.back().backwardRegions.back().outputGradBytes =
        costs.back().outputBytes;
  }
  if (!anyCost)
    for (StageCost &cost : costs) {
      cost.recomputeUs = cost.checkpointed ? 1 : 0;
      for (ReplayedRegionCost &replayed : cost.replayedRegions)
        replayed.replayUs = 1.0 / double(cost.replayedRegions.size());
      cost.forwardUs = cost.plainForwardUs = 1;
      cost.backwardInputUs = cost.backwardWeightUs = 1;
      cost.backwardUs = 2;
      // Unit time has no scale to put a transfer's microseconds on.
      cost.unshardUs = cost.reduceGradUs = 0;
    }
  return costs;
}

bool mlir::hpr::runsCheckpointed(ForwardOp forward,
                                 const std::vector<StageCost> &costs) {
  return costs[forward.getStageIndex()].checkpointed &&
         !forward.getNoCheckpoint();
}

/// The sum of `field` over the checkpointed regions `regions`.
template <typename T>
static T sumOverRegions(const StageCost &cost, llvm::ArrayRef<int64_t> regions,
                        T ReplayedRegionCost::*field) {
  T sum = 0;
  for (int64_t index : regions) // hpr-verify rejects an index out of range
    if (index >= 0 && size_t(index) < cost.replayedRegions.size())
      sum += cost.replayedRegions[index].*field;
  return sum;
}

double mlir::hpr::replayUsOf(const StageCost &cost,
                             llvm::ArrayRef<int64_t> regions) {
  return sumOverRegions(cost, regions, &ReplayedRegionCost::replayUs);
}

int64_t mlir::hpr::replayBytesOf(const StageCost &cost,
                                 llvm::ArrayRef<int64_t> regions) {
  return sumOverRegions(cost, regions, &ReplayedRegionCost::replayBytes);
}

int64_t mlir::hpr::weightReplayBytesOf(const StageCost &cost,
                                       llvm::ArrayRef<int64_t> regions) {
  return sumOverRegions(cost, regions, &ReplayedRegionCost::weightReplayBytes);
}

int64_t
mlir::hpr::wholeBackwardPeakBytes(const StageCost &cost, bool checkpointed,
                                  llvm::ArrayRef<int64_t> replayedBefore) {
  std::vector<char> isReplayedBefore(cost.replayedRegions.size(), false);
  for (int64_t index : replayedBefore)
    if (index >= 0 && size_t(index) < isReplayedBefore.size())
      isReplayedBefore[index] = true;
  int64_t kept = keptBytesOf(cost, checkpointed);
  int64_t worst = 0;
  int64_t heldBefore = 0; // Replays held of the regions before region j.
  for (const BackwardRegionCost &region : cost.backwardRegions) {
    int64_t at = region.workspaceBytes + region.outputGradBytes;
    if (!checkpointed) {
      worst = std::max(worst, at + region.plainKeptThrough - kept);
      continue;
    }
    int64_t replay = region.replayed < 0
                         ? 0
                         : cost.replayedRegions[region.replayed].replayBytes;
    worst =
        std::max(worst, at + region.keptThrough + heldBefore + replay - kept);
    if (region.replayed >= 0 && isReplayedBefore[region.replayed])
      heldBefore += replay;
  }
  return worst;
}

int64_t
mlir::hpr::backwardReplayBytesAfter(const StageCost &cost,
                                    llvm::ArrayRef<int64_t> prefetched) {
  std::vector<char> isPrefetched(cost.replayedRegions.size(), false);
  for (int64_t index : prefetched)
    if (index >= 0 && size_t(index) < isPrefetched.size())
      isPrefetched[index] = true;
  // On entry: every prefetched region's tensors on top of what is kept.
  int64_t worst = cost.keptBytes + replayBytesOf(cost, prefetched);
  int64_t prefetchedBefore = 0; // Prefetched regions before region j.
  for (auto [j, region] : llvm::enumerate(cost.replayedRegions)) {
    worst = std::max(worst, region.keptThrough + region.replayBytes +
                                prefetchedBefore);
    if (isPrefetched[j])
      prefetchedBefore += region.replayBytes;
  }
  return std::max<int64_t>(0, worst - cost.keptBytes);
}
