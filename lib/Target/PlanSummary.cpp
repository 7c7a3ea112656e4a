//===- PlanSummary.cpp - What a planned module does and costs ------------===//

#include "hpr/Target/PlanSummary.h"

#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/StepMemory.h"
#include "hpr/Dialect/HPR/HPROps.h"

#include "llvm/ADT/DenseSet.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::hpr;

/// Counts and the peak memory of one program under the cost model.
static RankSummary summarizeProgram(ProgramOp program,
                                    const std::vector<StageCost> &costs) {
  RankSummary summary;
  llvm::DenseSet<Operation *> replayed; // sessions with a recompute so far
  for (Operation &op : program.getBody().getOps()) {
    if (auto session = dyn_cast<SessionOp>(op)) {
      ++summary.sessions;
      for (Operation *user : session.getSession().getUsers())
        summary.perBackwardRecomputes += isa<ConsumerOpInterface>(user);
      continue;
    }
    ++summary.actions;
    // A replay in pieces is one recompute: count the session's first piece.
    // A replay for a dw is one more.
    if (auto recompute = dyn_cast<RecomputeOp>(op)) {
      summary.weightReplays += recompute.getForWeight();
      summary.recomputes += recompute.getForWeight() ||
                            replayed.insert(recompute.getSessionOp()).second;
    }
    summary.clears += isa<ClearOp>(op);
  }
  ProgramActivations activations = collectActivationLifetimes(program);
  ActivationProfile profile = computeActivationProfile(activations, costs);
  summary.peakBytes = profile.peak();
  summary.maxLiveSessions = countMaxLiveReplays(activations);
  summary.peakMemoryBytes =
      computeStepPeakBytes(program, activations, profile, costs);
  return summary;
}

RankSummary PlanSummary::total() const {
  RankSummary sum;
  for (const RankSummary &rank : ranks) {
    sum.actions += rank.actions;
    sum.sessions += rank.sessions;
    sum.recomputes += rank.recomputes;
    sum.weightReplays += rank.weightReplays;
    sum.clears += rank.clears;
    sum.perBackwardRecomputes += rank.perBackwardRecomputes;
    sum.maxLiveSessions = std::max(sum.maxLiveSessions, rank.maxLiveSessions);
    sum.peakBytes = std::max(sum.peakBytes, rank.peakBytes);
    sum.peakMemoryBytes = std::max(sum.peakMemoryBytes, rank.peakMemoryBytes);
    sum.hiddenRecomputeUs += rank.hiddenRecomputeUs;
    sum.exposedRecomputeUs += rank.exposedRecomputeUs;
  }
  return sum;
}

llvm::Expected<PlanSummary> mlir::hpr::summarizePlan(ModuleOp module) {
  std::vector<StageCost> costs = computeStageCosts(getModel(module));
  PlanSummary summary;
  for (ProgramOp program : getSchedule(module).getBody().getOps<ProgramOp>())
    summary.ranks.push_back(summarizeProgram(program, costs));
  summary.timeline = extractSchedule(module, costs);
  llvm::Expected<sched::SimulationResult> simulation =
      simulateTimeline(summary.timeline.schedule);
  if (!simulation)
    return simulation.takeError();
  summary.simulation = std::move(*simulation);
  for (auto [rank, exposure] : llvm::enumerate(measureRecomputeExposure(
           summary.timeline.schedule, summary.simulation))) {
    summary.ranks[rank].hiddenRecomputeUs = exposure.hiddenUs;
    summary.ranks[rank].exposedRecomputeUs = exposure.exposedUs;
  }
  return summary;
}
