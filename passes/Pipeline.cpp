//===- Pipeline.cpp - The recompute planning pipeline and registration ---===//

#include "hpr/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace mlir::hpr;

void mlir::hpr::buildPlanningPasses(OpPassManager &pm,
                                    const RecomputePipelineOptions &options) {
  if (options.checkSchedule)
    pm.addPass(createHPRVerifyComm());
  if (options.select == CheckpointSelection::Auto) {
    HPRSelectCheckpointsOptions select;
    select.budget = options.budget;
    pm.addPass(createHPRSelectCheckpoints(select));
  }
  pm.addPass(createHPRAssignSessions());
  HPRInsertRecomputeOptions recompute;
  recompute.policy = options.policy;
  recompute.distance = options.distance;
  // The budget is the selection's when it selects; otherwise it goes to the
  // placement, which refuses it unless it places by time.
  if (options.policy == RecomputePolicy::Bubble ||
      options.select != CheckpointSelection::Auto)
    recompute.budget = options.budget;
  pm.addPass(createHPRInsertRecompute(recompute));
  pm.addPass(createHPRInsertClear());
}

void mlir::hpr::buildRecomputePipeline(
    OpPassManager &pm, const RecomputePipelineOptions &options) {
  buildPlanningPasses(pm, options);
  pm.addPass(createHPRVerify());
}

void mlir::hpr::registerRecomputePipeline() {
  PassPipelineRegistration<RecomputePipelineOptions>(
      "hpr-recompute-pipeline",
      "Plan recomputation: check the schedule, (select checkpoints,) assign "
      "sessions, insert recompute and clear, verify",
      buildRecomputePipeline);
}
