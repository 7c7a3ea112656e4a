//===- Passes.h - hpr recompute planning passes -----------------*- C++ -*-===//

#ifndef HPR_TRANSFORMS_PASSES_H
#define HPR_TRANSFORMS_PASSES_H

#include "hpr/Dialect/HPR/HPROps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

#include <string>

namespace mlir::hpr {

/// Where a session's replay goes: hpr-insert-recompute places it jit or by
/// lookahead; bubble is jit, then hpr-prefetch-into-bubbles (Passes.td).
enum class RecomputePolicy { Jit, Lookahead, Bubble };

/// Which of its greedy placements hpr-prefetch-into-bubbles keeps: the
/// faster of both (the planner's), or one alone (to compare them).
enum class BubblePlacement { Faster, Critical, EveryFit };

/// Whether the pipeline keeps the model's checkpoint marks or chooses them
/// (hpr-select-checkpoints).
enum class CheckpointSelection { Model, Auto };

#define GEN_PASS_DECL
#include "hpr/Transforms/Passes.h.inc"

/// Options of the recompute planning pipeline (`hpr-recompute-pipeline`).
struct RecomputePipelineOptions
    : public PassPipelineOptions<RecomputePipelineOptions> {
  Option<RecomputePolicy> policy{
      *this, "policy", llvm::cl::desc("Recompute placement"),
      llvm::cl::init(RecomputePolicy::Jit),
      llvm::cl::values(
          clEnumValN(RecomputePolicy::Jit, "jit",
                     "right before the first consumer"),
          clEnumValN(RecomputePolicy::Lookahead, "lookahead",
                     "`distance` compute actions earlier"),
          clEnumValN(RecomputePolicy::Bubble, "bubble",
                     "into simulated idle time, within `budget`"))};
  Option<unsigned> distance{
      *this, "distance",
      llvm::cl::desc("With policy=lookahead: compute actions earlier"),
      llvm::cl::init(1)};
  Option<int64_t> budget{
      *this, "budget",
      llvm::cl::desc("Per-rank activation budget in bytes: dw deferral "
                     "(hpr-bound-weight-deferral), the checkpoint choice "
                     "(select=auto) and bubble placement stay within it (0: "
                     "none)"),
      llvm::cl::init(0)};
  Option<int64_t> deferralBudget{
      *this, "deferral-budget",
      llvm::cl::desc("Per-rank activation bytes hpr-bound-weight-deferral "
                     "fits the schedule into, at most `budget` (0: "
                     "`budget`): a lower one runs dws earlier and leaves the "
                     "checkpoint choice more room"),
      llvm::cl::init(0)};
  Option<bool> weightReplay{
      *this, "weight-replay",
      llvm::cl::desc("With a budget: hpr-bound-weight-deferral may let a dx "
                     "drop its session's replay and its dw replay again "
                     "(weight_replay)"),
      llvm::cl::init(true)};
  Option<bool> fuseWeights{
      *this, "fuse-weights",
      llvm::cl::desc("With a budget: hpr-bound-weight-deferral first fuses "
                     "every dx with its dw (fuse-all), the schedule its dws "
                     "are deferred from"),
      llvm::cl::init(false)};
  Option<bool> deferAfterChoice{
      *this, "defer-after-choice",
      llvm::cl::desc("With select=auto and a budget: after the choice, "
                     "hpr-bound-weight-deferral moves dws into idle time "
                     "again, priced as the choice left the stages "
                     "(after-choice)"),
      llvm::cl::init(true)};
  Option<BubblePlacement> placement{
      *this, "placement",
      llvm::cl::desc("With policy=bubble and select=model: which "
                     "placement to keep"),
      llvm::cl::init(BubblePlacement::Faster),
      llvm::cl::values(clEnumValN(BubblePlacement::Faster, "faster",
                                  "the faster of both (on a tie, the "
                                  "critical one)"),
                       clEnumValN(BubblePlacement::Critical, "critical",
                                  "move only replays on a critical path"),
                       clEnumValN(BubblePlacement::EveryFit, "every-fit",
                                  "move every replay that fits"))};
  Option<CheckpointSelection> select{
      *this, "select", llvm::cl::desc("Which regions to checkpoint"),
      llvm::cl::init(CheckpointSelection::Model),
      llvm::cl::values(clEnumValN(CheckpointSelection::Model, "model",
                                  "as the model marks them"),
                       clEnumValN(CheckpointSelection::Auto, "auto",
                                  "hpr-select-checkpoints within `budget`"))};
  /// Run hpr-verify-comm first. The CLI turns it off: it imports only
  /// schedules that mlir::hpr::sched::validateSchedule, the same rules,
  /// accepted.
  bool checkSchedule = true;
  /// End with hpr-lower-runtime. hpr-select-checkpoints turns it off on the
  /// copies it only simulates, the planner driver on every contender it plans
  /// (it lowers the plan it chooses, once: PlanRequest::lowerRuntime).
  bool lowerRuntime = true;

  /// Refuses, through `emitError`, options that no pass of the pipeline would
  /// read: `distance` unless policy=lookahead, a `placement` but with
  /// policy=bubble and select=model, a negative budget, a `deferral-budget`
  /// without a budget or above it, and `weight-replay` without a budget.
  LogicalResult
  verify(function_ref<LogicalResult(const Twine &)> emitError) const;
};

/// The pass manager nested on every hpr.program of the module `pm` runs on
/// (through hpr.schedule): passes added to it run on the ranks in parallel.
OpPassManager &nestOnPrograms(OpPassManager &pm);

/// Appends the passes that build a plan: check the schedule
/// (hpr-verify-comm), bound dw deferral (with a budget), select checkpoints
/// (with select=auto), assign sessions,
/// insert recompute (prefetch into bubbles), insert clear, insert unshard
/// (with the model's dp_shard > 1), and last lower what runtimes read
/// (hpr-lower-runtime): every emitter prints a lowered module.
void buildPlanningPasses(OpPassManager &pm,
                         const RecomputePipelineOptions &options);

/// Appends the planning pipeline: buildPlanningPasses, then hpr-verify. The
/// tests and `hpr-recompute-pipeline` call this, the CLI the two parts with
/// the structural verifier in between, so the order is written once.
void buildRecomputePipeline(OpPassManager &pm,
                            const RecomputePipelineOptions &options);

/// The admission check of a finished plan, written by the planner or read
/// back (hpr/Target/PlanImport.h): MLIR's structural verifier (the op
/// verifiers), hpr-verify-comm with `plan` (the schedule rules: pairing, data
/// flow, tags, deadlock; REDUCE_GRAD once per stage, every receive posted)
/// and hpr-verify (the sessions), the last two both run whatever the other
/// finds. Diagnostics go to
/// the context's handler; the CLI, hp-recompute-opt's pipeline and every
/// runtime (through the Python bindings) run these same rules.
LogicalResult verifyPlan(ModuleOp module);

/// Registers `hpr-recompute-pipeline`, which refuses options it would not
/// read (RecomputePipelineOptions::verify); the passes themselves are
/// registered by the generated registerHPRPasses().
void registerRecomputePipeline();

#define GEN_PASS_REGISTRATION
#include "hpr/Transforms/Passes.h.inc"

} // namespace mlir::hpr

#endif // HPR_TRANSFORMS_PASSES_H
