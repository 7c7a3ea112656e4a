//===- Pipeline.cpp - The recompute planning pipeline and registration ---===//

#include "hpr/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace mlir::hpr;

void mlir::hpr::buildRecomputePipeline(
    OpPassManager &pm, const RecomputePipelineOptions &options) {
  pm.addPass(createHPRAssignSessions());
  HPRInsertRecomputeOptions recompute;
  recompute.policy = options.policy;
  recompute.distance = options.distance;
  pm.addPass(createHPRInsertRecompute(recompute));
  pm.addPass(createHPRInsertClear());
  pm.addPass(createHPRVerify());
}

void mlir::hpr::registerRecomputePipeline() {
  PassPipelineRegistration<RecomputePipelineOptions>(
      "hpr-recompute-pipeline",
      "Plan recomputation: assign sessions, insert recompute and clear, "
      "verify",
      buildRecomputePipeline);
}
