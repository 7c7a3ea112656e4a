//===- Pipeline.cpp - The recompute planning pipeline and registration ---===//

#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace mlir::hpr;

LogicalResult RecomputePipelineOptions::verify(
    function_ref<LogicalResult(const Twine &)> emitError) const {
  if (policy != RecomputePolicy::Lookahead &&
      (distance != 1 || distance.getNumOccurrences()))
    return emitError("hpr-recompute-pipeline: distance applies to "
                     "policy=lookahead only");
  // select=auto prices its contenders with the pipeline's placement
  // (buildPlanningPasses on copies), which is the faster one.
  if ((policy != RecomputePolicy::Bubble ||
       select == CheckpointSelection::Auto) &&
      placement.getNumOccurrences())
    return emitError("hpr-recompute-pipeline: placement applies to "
                     "policy=bubble with select=model only");
  if (budget < 0)
    return emitError("hpr-recompute-pipeline: budget must be >= 0, got " +
                     Twine(static_cast<int64_t>(budget)));
  if (weightReplay.getNumOccurrences() && budget == 0)
    return emitError("hpr-recompute-pipeline: weight-replay applies with a "
                     "budget only (hpr-bound-weight-deferral)");
  if (deferralBudget < 0 || (deferralBudget != 0 && deferralBudget > budget))
    return emitError("hpr-recompute-pipeline: deferral-budget must be "
                     "between 0 and budget, got " +
                     Twine(static_cast<int64_t>(deferralBudget)));
  return success();
}

OpPassManager &mlir::hpr::nestOnPrograms(OpPassManager &pm) {
  return pm.nest<ScheduleOp>().nest<ProgramOp>();
}

void mlir::hpr::buildPlanningPasses(OpPassManager &pm,
                                    const RecomputePipelineOptions &options) {
  if (options.checkSchedule)
    pm.addPass(createHPRVerifyComm());
  if (options.budget > 0) {
    HPRBoundWeightDeferralOptions deferral;
    deferral.budget =
        options.deferralBudget > 0 ? options.deferralBudget : options.budget;
    deferral.leastMemory = options.select == CheckpointSelection::Auto;
    deferral.weightReplay = options.weightReplay;
    deferral.fuseAll = options.fuseWeights;
    deferral.markFused =
        options.select == CheckpointSelection::Auto && options.deferAfterChoice;
    pm.addPass(createHPRBoundWeightDeferral(deferral));
  }
  if (options.select == CheckpointSelection::Auto) {
    HPRSelectCheckpointsOptions select;
    select.budget = options.budget;
    select.bubble = options.policy == RecomputePolicy::Bubble;
    pm.addPass(createHPRSelectCheckpoints(select));
    // With the choice made, dws move into idle time again, priced as it
    // left the stages (hpr-bound-weight-deferral, step 6).
    if (options.budget > 0 && options.deferAfterChoice) {
      HPRBoundWeightDeferralOptions deferral;
      deferral.budget = options.budget;
      deferral.afterChoice = true;
      deferral.bubble = options.policy == RecomputePolicy::Bubble;
      deferral.weightReplay = options.weightReplay;
      pm.addPass(createHPRBoundWeightDeferral(deferral));
    }
  }
  HPRInsertRecomputeOptions recompute;
  recompute.policy = options.policy == RecomputePolicy::Lookahead
                         ? RecomputePolicy::Lookahead
                         : RecomputePolicy::Jit;
  recompute.distance = options.distance;
  OpPassManager &programs = nestOnPrograms(pm);
  programs.addPass(createHPRAssignSessions());
  programs.addPass(createHPRInsertRecompute(recompute));
  // Before placement, around the jit replays: bubble placement then prices
  // the gathers in its timeline and keeps each replay inside its stage's
  // window, so moving a replay adds no all-gather and no gathered bytes.
  programs.addPass(createHPRInsertUnshard());
  if (options.policy == RecomputePolicy::Bubble) {
    HPRPrefetchIntoBubblesOptions bubbles;
    bubbles.budget = options.budget;
    bubbles.placement = options.placement;
    pm.addPass(createHPRPrefetchIntoBubbles(bubbles));
  }
  nestOnPrograms(pm).addPass(createHPRInsertClear());
  // Last: posts and waits name action positions.
  if (options.lowerRuntime)
    pm.addPass(createHPRLowerRuntime());
}

void mlir::hpr::buildRecomputePipeline(
    OpPassManager &pm, const RecomputePipelineOptions &options) {
  buildPlanningPasses(pm, options);
  nestOnPrograms(pm).addPass(createHPRVerify());
}

LogicalResult mlir::hpr::verifyPlan(ModuleOp module) {
  if (failed(mlir::verify(module)))
    return failure();
  // The schedule rules and the session rules are independent, so both run
  // and a plan is refused with all its problems: a hand edit that drops an
  // action leaves both a session unbalanced and the receives' posts (plan
  // indices) pointing past it.
  HPRVerifyCommOptions options;
  options.finishedPlan = true;
  PassManager comm(module.getContext());
  comm.enableVerifier(false); // the checks change nothing
  comm.addPass(createHPRVerifyComm(options));
  PassManager sessions(module.getContext());
  sessions.enableVerifier(false);
  nestOnPrograms(sessions).addPass(createHPRVerify());
  bool sound = succeeded(comm.run(module));
  sound &= succeeded(sessions.run(module));
  return success(sound);
}

void mlir::hpr::registerRecomputePipeline() {
  // PassPipelineRegistration's builder cannot fail; this one refuses options
  // the pipeline would not read.
  registerPassPipeline(
      "hpr-recompute-pipeline",
      "Plan recomputation: check the schedule, (select checkpoints,) assign "
      "sessions, insert recompute (and prefetch into bubbles) and clear, "
      "lower what runtimes read, verify",
      [](OpPassManager &pm, StringRef text,
         function_ref<LogicalResult(const Twine &)> errorHandler) {
        RecomputePipelineOptions options;
        if (failed(options.parseFromString(text)) ||
            failed(options.verify(errorHandler)))
          return failure();
        buildRecomputePipeline(pm, options);
        return success();
      },
      [](function_ref<void(const mlir::detail::PassOptions &)> printOptions) {
        printOptions(RecomputePipelineOptions());
      });
}
