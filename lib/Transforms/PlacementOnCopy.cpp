//===- PlacementOnCopy.cpp - Pricing a contender as it is placed ----------===//

#include "PlacementOnCopy.h"
#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/Timeline.h"
#include "hpr/Transforms/Passes.h"

using namespace mlir;
using namespace mlir::hpr;

void mlir::hpr::buildPlacementOnCopyPasses(OpPassManager &pm, int64_t budget) {
  RecomputePipelineOptions options;
  options.policy = RecomputePolicy::Bubble;
  options.budget = budget;
  options.checkSchedule = false;
  options.lowerRuntime = false; // only simulated
  buildPlanningPasses(pm, options);
}

llvm::Expected<std::optional<double>>
mlir::hpr::simulatePlacedCopy(ModuleOp copy, int64_t budget) {
  std::vector<StageCost> costs =
      computeStageCosts(*copy.getOps<ModelOp>().begin());
  bool within = true;
  for (ProgramOp program :
       (*copy.getOps<ScheduleOp>().begin()).getBody().getOps<ProgramOp>())
    within &=
        computeActivationProfile(collectActivationLifetimes(program), costs)
            .peak() <= budget;
  llvm::Expected<sched::SimulationResult> simulation =
      simulateTimeline(extractSchedule(copy, costs).schedule);
  if (!simulation)
    return simulation.takeError();
  return within ? std::optional<double>(simulation->makespan) : std::nullopt;
}
